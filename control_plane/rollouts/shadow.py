"""A rollout's shadow phase: each wave meets live inputs before it switches.

When a wave of a rollout with a :class:`~control_plane.rollouts.spec.ShadowSpec` starts, its
devices get the candidate's manifest marked as a shadow stage (signed, for each device alone):
they load and warm it next to the serving version, copy it a share of their live requests and
report how often the two agree (:mod:`common.protocol.shadow`). The devices stay ``pending``
meanwhile. The gate sums the wave's reports since the phase began::

    running --min_requests shadowed, agreement >= min_agreement--> passed  (the wave switches)
    running --agreement below it, a device refused the candidate,
              or timeout_s without min_requests--> failed (the rollout rolls back, unswitched)
    running | failed --the rollout rolls back--> the shadows withdrawn (candidates unloaded)

The phase's state and numbers are kept per wave on the rollout (``Rollout.shadow``), which the
API and ``edgefleet rollouts status`` show.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from common.protocol.messages import ModelManifest
from common.protocol.shadow import ShadowStage
from control_plane.db.models import Device, Rollout, RolloutDevice, ShadowReportRecord
from control_plane.db.states import FAILED, DeviceRolloutState
from control_plane.rollouts.events import CHUNK
from control_plane.rollouts.manifests import for_device
from control_plane.rollouts.rollback import restore_desired
from control_plane.rollouts.spec import ShadowSpec

Sign = Callable[[ModelManifest], dict[str, Any]]
Publish = Callable[[Device], None]
WITHDRAWN = "shadow withdrawn: the candidate is unloaded, never switched to"


async def shadow_wave(
    session: AsyncSession,
    rollout: Rollout,
    wave_devices: list[RolloutDevice],
    now: datetime,
    *,
    sign: Sign,
    publish: Publish,
    ttl_s: float,
) -> tuple[bool, str | None]:
    """Run the current wave's shadow phase: whether the wave must wait (not switch yet), and
    why the rollout fails, if it does."""
    assert rollout.shadow is not None
    spec = ShadowSpec.model_validate(rollout.shadow["spec"])
    wave = str(rollout.current_wave)
    state = rollout.shadow["waves"].get(wave)
    if state is None:
        staged = 0
        for rd in wave_devices:
            if rd.state is DeviceRolloutState.PENDING:
                staged += await _stage(session, rollout, rd, spec, now, sign, publish, ttl_s)
        _save(rollout, wave, {"state": "running", "started_at": now.isoformat(), "devices": staged})
        return True, None
    if state["state"] == "passed":
        return False, None
    if state["state"] != "running":
        return True, None
    refused = [rd for rd in wave_devices if rd.state in FAILED]
    report = await shadow_report(
        session,
        rollout,
        [rd.device_id for rd in wave_devices],
        datetime.fromisoformat(state["started_at"]),
    )
    state = {**state, **report}
    verdict = None
    if refused:
        verdict = f"shadow: {refused[0].device_id} did not stage the candidate: {refused[0].reason}"
    elif report["requests"] >= spec.min_requests:
        agreement = report["agreement"]
        if agreement is not None and agreement >= spec.min_agreement:
            state["state"] = "passed"
            _save(rollout, wave, state)
            return False, None
        verdict = (
            f"shadow: the candidate agreed with the serving version on {_pct(agreement)} of "
            f"{report['rows']} rows ({report['requests']} requests), below min_agreement "
            f"{spec.min_agreement:.1%}; max abs diff {report['max_abs_diff'] or 0:.3g}"
        )
    elif now - datetime.fromisoformat(state["started_at"]) > timedelta(seconds=spec.timeout_s):
        verdict = (
            f"shadow: {report['requests']} shadowed requests within timeout_s "
            f"{spec.timeout_s:g} s, fewer than min_requests {spec.min_requests}"
        )
    if verdict is not None:
        state |= {"state": "failed", "reason": verdict}
    _save(rollout, wave, state)
    return True, verdict


async def withdraw_shadows(
    session: AsyncSession, rollout: Rollout, now: datetime, publish: Publish
) -> None:
    """The rollout rolls back: every device still shadowing (a wave that had not switched)
    gets its desired state back, which unloads the candidate, and leaves the rollout."""
    if rollout.shadow is None:
        return
    for wave, state in rollout.shadow["waves"].items():
        if state["state"] == "passed" or state.get("withdrawn"):
            continue
        for rd in rollout.devices:
            if rd.wave != int(wave):
                continue
            if rd.state is DeviceRolloutState.PENDING or rd.state in FAILED:
                await restore_desired(session, rollout, rd, publish)
            if rd.state is DeviceRolloutState.PENDING:
                rd.state, rd.reason, rd.updated_at = DeviceRolloutState.REVERTED, WITHDRAWN, now
        _save(rollout, wave, {**state, "withdrawn": True})


async def shadow_report(
    session: AsyncSession, rollout: Rollout, device_ids: list[str], since: datetime
) -> dict[str, Any]:
    """The shadow windows of the rollout's candidate on these devices, received since
    ``since``, summed: requests, rows, agreement, drops, errors, the largest difference, the
    mean relative error and both versions' mean compute time."""
    r = ShadowReportRecord
    sums: list[float] = [0.0] * 8
    worst: float | None = None
    for start in range(0, len(device_ids), CHUNK):
        row = (
            await session.execute(
                select(
                    func.coalesce(func.sum(r.requests), 0),
                    func.coalesce(func.sum(r.rows), 0),
                    func.coalesce(func.sum(r.matched), 0),
                    func.coalesce(func.sum(r.dropped), 0),
                    func.coalesce(func.sum(r.errors), 0),
                    func.coalesce(func.sum(r.rel_error_sum), 0.0),
                    func.coalesce(func.sum(r.candidate_ms_sum), 0.0),
                    func.coalesce(func.sum(r.serving_ms_sum), 0.0),
                    func.max(r.max_abs_diff),
                ).where(
                    r.model == rollout.model,
                    r.version == rollout.version,
                    r.sequence == rollout.sequence,
                    r.device_id.in_(device_ids[start : start + CHUNK]),
                    r.received_at >= since,
                )
            )
        ).one()
        sums = [a + b for a, b in zip(sums, row[:8], strict=True)]
        if row[8] is not None:
            worst = float(row[8]) if worst is None else max(worst, float(row[8]))
    requests, rows, matched, dropped, errors, rel, cand_ms, serv_ms = sums
    return {
        "requests": int(requests),
        "rows": int(rows),
        "matched": int(matched),
        "agreement": matched / rows if rows else None,
        "dropped": int(dropped),
        "errors": int(errors),
        "max_abs_diff": worst,
        "mean_rel_error": rel / requests if requests else None,
        "candidate_ms": cand_ms / requests if requests else None,
        "serving_ms": serv_ms / requests if requests else None,
        "latency_ratio": cand_ms / serv_ms if serv_ms else None,
    }


async def _stage(
    session: AsyncSession,
    rollout: Rollout,
    rd: RolloutDevice,
    spec: ShadowSpec,
    now: datetime,
    sign: Sign,
    publish: Publish,
    ttl_s: float,
) -> int:
    device = await session.get(Device, rd.device_id)
    if device is None:
        return 0
    manifest = for_device(rollout.manifest, device.id, now, ttl_s).model_copy(
        update={"shadow": ShadowStage(sample_share=spec.sample_share)}
    )
    device.desired = {**device.desired, rollout.model: sign(manifest)}
    rd.reason, rd.updated_at = "shadowing: the candidate is staged, not switched to", now
    publish(device)
    return 1


def _save(rollout: Rollout, wave: str, state: dict[str, Any]) -> None:
    assert rollout.shadow is not None
    # a new object: the JSON column sees assignments, not changes inside it
    rollout.shadow = {**rollout.shadow, "waves": {**rollout.shadow["waves"], wave: state}}


def _pct(value: float | None) -> str:
    return "no" if value is None else f"{value:.1%}"
