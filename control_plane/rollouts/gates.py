"""The telemetry health gates of a rollout's wave: error rate and p99 latency of the new
version on the devices that committed it, against the previous version's before the rollout;
for a generative version also its p99 time to first token and between tokens, against the
limits the rollout sets."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import InputDrift, Rollout, RolloutDevice, TelemetrySample
from control_plane.db.session import required_utc
from control_plane.db.states import DeviceRolloutState
from control_plane.rollouts.events import CHUNK
from control_plane.rollouts.spec import Gates

BASELINE = timedelta(minutes=10)
"""How far before a rollout the previous version's latency is read."""


async def telemetry_gates(
    session: AsyncSession,
    rollout: Rollout,
    gates: Gates,
    touched: list[RolloutDevice],
    now: datetime,
) -> tuple[str | None, dict[str, Any]]:
    """Judge the telemetry of a wave's devices (``touched``): why the rollout fails, or None
    (passed, or fewer than ``gates.min_requests`` requests so far), and the report shown on
    the rollout."""
    ids = [d.device_id for d in touched if d.state is DeviceRolloutState.COMMITTED]
    # every window of the new version on touched devices counts: it only runs there since
    # they switched, whatever the bake window says. Windows are chosen by when the control
    # plane received them, not by their time: a device's clock behind by more than the
    # rollout's age dates them before it, one ahead dates them past now (or an earlier,
    # rolled-back rollout's inside it), and the gates would judge the wrong windows.
    since = required_utc(rollout.created_at)
    new = await _window(session, rollout.model, rollout.version, ids, since, now)
    report: dict[str, Any] = {
        "requests": new["requests"],
        "errors": new["errors"],
        "p99_ms": new["p99_ms"],
    }
    if new["generated_tokens"]:
        report |= {k: new[k] for k in ("ttft_p99_ms", "inter_token_p99_ms", "generated_tokens")}
    if new["requests"] < max(gates.min_requests, 1):
        report["note"] = (
            f"fewer than {gates.min_requests} requests: error rate and latency not judged yet"
        )
        return None, report
    rate = new["errors"] / new["requests"]
    report["error_rate"] = rate
    if rate > gates.max_error_rate:
        return (
            f"error rate {rate:.1%} over {new['requests']} requests "
            f"exceeds {gates.max_error_rate:.1%}",
            report,
        )
    verdict = _token_verdict(new, gates)
    if verdict is not None:
        return verdict, report
    previous = {d.previous_version for d in touched if d.previous_version is not None}
    if previous and new["p99_ms"]:
        # the previous version's windows received in the BASELINE before the rollout
        created = required_utc(rollout.created_at)
        base = await _window(
            session, rollout.model, previous.pop(), ids, created - BASELINE, created
        )
        if base["p99_ms"] and base["requests"] >= gates.min_requests:
            ratio = new["p99_ms"] / base["p99_ms"]
            report["p99_ratio"] = ratio
            if ratio > gates.max_p99_ratio:
                return (
                    f"p99 latency {new['p99_ms']:.1f} ms is {ratio:.2f}x "
                    "the previous version's "
                    f"{base['p99_ms']:.1f} ms (limit {gates.max_p99_ratio}x)",
                    report,
                )
    return None, report


def _token_verdict(new: dict[str, Any], gates: Gates) -> str | None:
    """Why a generative version's token latencies fail the gates, else None (also for a
    version with no such figures: a batch model's)."""
    for key, limit, what in (
        ("ttft_p99_ms", gates.max_ttft_p99_ms, "time to first token"),
        ("inter_token_p99_ms", gates.max_inter_token_p99_ms, "inter-token latency"),
    ):
        value = new[key]
        if limit is not None and value is not None and value > limit:
            gate = f"max_{key}"
            return f"p99 {what} {value:.1f} ms exceeds {gate} {limit:g} ms"
    return None


async def _window(
    session: AsyncSession,
    model: str,
    version: int,
    device_ids: list[str],
    since: datetime,
    until: datetime,
) -> dict[str, Any]:
    """Requests, errors and request-weighted p99 of a model version on some devices, over the
    windows the control plane received from ``since`` to ``until`` (its own clock); and its
    tokens generated, its sequence-weighted TTFT p99 and token-weighted inter-token p99."""
    empty = {"requests": 0, "errors": 0, "p99_ms": None, "generated_tokens": 0}
    if not device_ids:
        return empty | {"ttft_p99_ms": None, "inter_token_p99_ms": None}
    t = TelemetrySample
    with_p99 = case((t.p99_ms.is_not(None), t.requests), else_=0)
    with_ttft = case((t.ttft_p99_ms.is_not(None), t.requests), else_=0)
    with_gap = case((t.inter_token_p99_ms.is_not(None), t.generated_tokens), else_=0)
    sums = [0.0] * 9
    for start in range(0, len(device_ids), CHUNK):
        row = (
            await session.execute(
                select(
                    func.coalesce(func.sum(t.requests), 0),
                    func.coalesce(func.sum(t.errors), 0),
                    func.coalesce(func.sum(t.p99_ms * with_p99), 0),
                    func.coalesce(func.sum(with_p99), 0),
                    func.coalesce(func.sum(t.ttft_p99_ms * with_ttft), 0),
                    func.coalesce(func.sum(with_ttft), 0),
                    func.coalesce(func.sum(t.inter_token_p99_ms * with_gap), 0),
                    func.coalesce(func.sum(with_gap), 0),
                    func.coalesce(func.sum(t.generated_tokens), 0),
                ).where(
                    t.model == model,
                    t.version == version,
                    t.device_id.in_(device_ids[start : start + CHUNK]),
                    t.received_at >= since,
                    t.received_at <= until,
                )
            )
        ).one()
        sums = [a + float(b) for a, b in zip(sums, row, strict=True)]

    def mean(total: float, weight: float) -> float | None:
        return total / weight if weight else None

    return {
        "requests": int(sums[0]),
        "errors": int(sums[1]),
        "p99_ms": mean(sums[2], sums[3]),
        "ttft_p99_ms": mean(sums[4], sums[5]),
        "inter_token_p99_ms": mean(sums[6], sums[7]),
        "generated_tokens": int(sums[8]),
    }


async def drift_gate(
    session: AsyncSession,
    rollout: Rollout,
    gates: Gates,
    touched: list[RolloutDevice],
    previous: dict[str, Any] | None,
) -> tuple[str | None, dict[str, Any] | None]:
    """Judge ``gates.max_drift`` on the input drift of the new version on the committed
    devices of the waves so far, computed since the rollout began: why the rollout pauses, or
    None, and the report (None when the gate is off). ``previous``: this wave's drift report
    at the last step: a wave the operator resumed after a drift pause is not paused again."""
    if gates.max_drift is None:
        return None, None
    ids = [d.device_id for d in touched if d.state is DeviceRolloutState.COMMITTED]
    worst: InputDrift | None = None
    judged = 0
    for start in range(0, len(ids), CHUNK):
        rows = await session.execute(
            select(InputDrift).where(
                InputDrift.model == rollout.model,
                InputDrift.version == rollout.version,
                InputDrift.device_id.in_(ids[start : start + CHUNK]),
                InputDrift.computed_at >= required_utc(rollout.created_at),
            )
        )
        for row in rows.scalars():
            judged += 1
            if worst is None or row.psi > worst.psi:
                worst = row
    report: dict[str, Any] = {"max_drift": gates.max_drift, "devices_judged": judged}
    if worst is None:
        report["note"] = "no input drift judged yet on the wave's devices"
        return None, report
    report |= {"psi": worst.psi, "ks": worst.ks, "device_id": worst.device_id}
    report["feature"] = worst.feature
    if worst.psi <= gates.max_drift:
        return None, report
    if previous is not None and previous.get("paused"):
        report["paused"] = True
        report["note"] = "over max_drift; resumed by an operator: not paused again this wave"
        return None, report
    report["paused"] = True
    return (
        f"{_drift_kind(worst.feature)} drift: PSI {worst.psi:.3f} on {worst.feature} "
        f"at {worst.device_id} "
        f"exceeds max_drift {gates.max_drift} (KS {worst.ks:.3f})",
        report,
    )


def _drift_kind(feature: str) -> str:
    """``output`` for a judged output or top-1 class (``output:logits[3]``), else ``input``."""
    return "output" if feature.startswith(("output:", "top1:")) else "input"
