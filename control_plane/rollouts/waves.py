"""Judging a rollout's current wave, once its devices were sent their manifests (the rollout
engine's ``_run_waves``): devices that did not answer in time, rejections and self-test
failures, the bake time, the telemetry health gates, the drift gate and the live accuracy
gate. A failed wave rolls
the rollout back (:func:`fail`); a wave that passed hands over to the next."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import Rollout, RolloutDevice
from control_plane.db.session import required_utc
from control_plane.db.states import FAILED, WAVE_DONE, DeviceRolloutState, RolloutState
from control_plane.rollouts.accuracy_gate import accuracy_gate
from control_plane.rollouts.agent import UNJUDGED, is_agent
from control_plane.rollouts.gates import drift_gate, telemetry_gates
from control_plane.rollouts.spec import Gates

log = logging.getLogger("edgefleet.control_plane.rollouts")


async def judge_wave(
    session: AsyncSession,
    rollout: Rollout,
    gates: Gates,
    wave_devices: list[RolloutDevice],
    now: datetime,
) -> bool:
    """Judge ``rollout``'s current wave: it fails (the rollout rolls back), pauses it (its
    drift gate), waits, or passes. Whether it passed and the rollout moved on to its next
    wave (which the caller then runs); the last wave passed, the rollout succeeded."""
    for rd in wave_devices:
        if (
            rd.state is DeviceRolloutState.SENT
            and required_utc(rd.sent_at) + timedelta(seconds=rollout.device_timeout_s) < now
        ):
            rd.state, rd.reason, rd.updated_at = (
                DeviceRolloutState.TIMED_OUT,
                "no answer within device_timeout_s",
                now,
            )
    touched = [d for d in rollout.devices if d.wave <= rollout.current_wave]
    failed = [d for d in touched if d.state in FAILED]
    self_test = [d for d in failed if "self_test_failed" in d.reason]
    if gates.self_test and self_test:
        fail(rollout, f"self-test failed on {self_test[0].device_id}: {self_test[0].reason}")
        return False
    if len(failed) > gates.max_rejections:
        fail(
            rollout,
            f"{len(failed)} device(s) refused or rolled back the update "
            f"(allowed {gates.max_rejections}); "
            f"first: {failed[0].device_id}: {failed[0].reason}",
        )
        return False
    if any(d.state not in WAVE_DONE for d in wave_devices):
        return False
    if wave_devices and not any(d.state is DeviceRolloutState.COMMITTED for d in wave_devices):
        # No evidence the version works anywhere (every device timed out, or refused within
        # max_rejections): going on would roll it out wider blind. A dead artifact URL or a
        # broker that refuses the devices' topics looks exactly like this.
        timed_out = sum(d.state is DeviceRolloutState.TIMED_OUT for d in wave_devices)
        fail(
            rollout,
            f"no device of wave {rollout.current_wave + 1} committed the update "
            f"({timed_out} timed out, {len(wave_devices) - timed_out} refused it)",
        )
        return False
    if rollout.bake_started_at is None:
        rollout.bake_started_at = now
    baked = required_utc(rollout.bake_started_at) + timedelta(seconds=rollout.bake_time_s)
    if is_agent(rollout):  # the launchers' trials were its gate: every device committed
        verdict, report, pause, waiting = None, {"note": UNJUDGED}, None, False
    else:
        verdict, report, pause, waiting = await _model_gates(
            session, rollout, gates, touched, now, baked
        )
    rollout.gate_report = {**rollout.gate_report, str(rollout.current_wave): report}
    if verdict:
        fail(rollout, verdict)
        return False
    if pause:  # the data moved, not the version: an operator decides, nothing rolls back
        rollout.state, rollout.reason = RolloutState.PAUSED, pause
        log.warning("rollout paused by a gate", extra={"rollout": rollout.id, "reason": pause})
        return False
    if baked > now or waiting:
        return False  # still baking, or waiting for requests to judge
    if rollout.current_wave + 1 >= len(rollout.waves) or not [
        d for d in rollout.devices if d.wave > rollout.current_wave
    ]:
        rollout.state, rollout.reason = (
            RolloutState.SUCCEEDED,
            f"all {len(rollout.waves)} waves passed their gates",
        )
        log.info("rollout succeeded", extra={"rollout": rollout.id})
        return False
    rollout.current_wave += 1
    rollout.wave_started_at = rollout.bake_started_at = None
    return True


async def _model_gates(
    session: AsyncSession,
    rollout: Rollout,
    gates: Gates,
    touched: list[RolloutDevice],
    now: datetime,
    baked: datetime,
) -> tuple[str | None, dict[str, Any], str | None, bool]:
    """A model version's gates on the wave: why it fails (or None), their report, why it
    pauses (or None), and whether it waits past its bake for what they need to judge."""
    verdict, report = await telemetry_gates(session, rollout, gates, touched, now)
    # Gates that could not judge (too few requests) prove nothing: the wave waits for
    # traffic past its bake, unless the rollout was created to pass it anyway.
    waiting = (
        baked <= now
        and "note" in report
        and gates.min_requests > 0  # 0: the operator asks for no requests at all
        and not gates.allow_unjudged
    )
    if waiting:
        report["waiting_for_traffic"] = True
    pause, unjudged = await _pausing_gates(session, rollout, gates, touched, now, report)
    if baked <= now and unjudged and not gates.allow_unjudged:
        waiting = True
        report |= dict.fromkeys(unjudged, True)
    return verdict, report, pause, waiting


async def _pausing_gates(
    session: AsyncSession,
    rollout: Rollout,
    gates: Gates,
    touched: list[RolloutDevice],
    now: datetime,
    report: dict[str, Any],
) -> tuple[str | None, list[str]]:
    """The gates that pause a rollout rather than fail it (input drift, live accuracy), their
    reports added to ``report``: why it pauses (or None), and the report keys of those that
    could not judge yet (that proves nothing either: the wave waits as the others do, past
    its bake)."""
    earlier = rollout.gate_report.get(str(rollout.current_wave), {})
    pause, drift = await drift_gate(session, rollout, gates, touched, earlier.get("drift"))
    unjudged = []
    if drift is not None:
        report["drift"] = drift
        if not drift.get("devices_judged"):
            unjudged.append("waiting_for_drift")
    accuracy_pause, accuracy = await accuracy_gate(
        session, rollout, gates, touched, now, earlier.get("accuracy")
    )
    if accuracy is not None:
        report["accuracy"] = accuracy
        if not accuracy["judged"]:
            unjudged.append("waiting_for_outcomes")
    return pause or accuracy_pause, unjudged


def fail(rollout: Rollout, reason: str) -> None:
    """``rollout`` failed a gate: it rolls back from its next step."""
    rollout.state, rollout.reason = RolloutState.ROLLING_BACK, reason
    log.warning(
        "rollout gate failed: rolling back", extra={"rollout": rollout.id, "reason": reason}
    )
