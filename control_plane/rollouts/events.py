"""Device events applied to the rollouts they belong to: a device's final state (committed,
rejected, rolled back) or a fault it reports while it retries moves its row at once; the
rollout loop then steps the rollouts touched."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from common.protocol.messages import UpdateEvent, UpdateState
from control_plane.db.models import Rollout, RolloutDevice
from control_plane.db.states import DeviceRolloutState, RolloutState

OUTCOMES = {
    UpdateState.COMMITTED: DeviceRolloutState.COMMITTED,
    UpdateState.REJECTED: DeviceRolloutState.REJECTED,
    UpdateState.ROLLED_BACK: DeviceRolloutState.ROLLED_BACK,
}
"""A device's final update states, and what each makes of its row in the rollout."""
REFUSALS = (UpdateState.ROLLED_BACK, UpdateState.REJECTED)
NEVER_REPORTED = "never reported the new version"
"""Reason of a device given up on while rolling back: a commit it reports later reopens it."""
SWITCHED_BEFORE_CANCEL = "switched before the cancel reached it: keeps the new version"
DROPPED = "; the device dropped it"
REASON_LIMIT = 1024
"""Characters of a device's reason kept (a self-test's report can run to kilobytes)."""
CHUNK = 1000
"""Device ids per ``IN`` list: one bound parameter each, and PostgreSQL takes 65,535."""


def moves_rollout(event: UpdateEvent) -> bool:
    """A final state, or a fault the device reports while it retries (shown on the rollout);
    plain progress (received, downloading, ...) moves nothing."""
    return event.state in OUTCOMES or bool(event.code)


async def apply_events(session: AsyncSession, events: list[UpdateEvent]) -> set[int]:
    """Apply ``events`` (those that move a rollout) to their rollouts' device rows; the ids of
    the rollouts touched."""
    prefetched = await _rows_for(session, events)
    reverting = await _reverting_for(session, events)
    touched: set[int] = set()
    for event in events:
        rollout_id = await _apply_event(session, event, prefetched, reverting)
        if rollout_id is not None:
            touched.add(rollout_id)
    return touched


async def _rows_for(
    session: AsyncSession, events: list[UpdateEvent]
) -> dict[tuple[int, str], RolloutDevice]:
    """The rollout rows a batch of events can move, in one query per rollout rather than
    one per event (a rollout to thousands of devices reports thousands of events)."""
    wanted: dict[int, set[str]] = {}
    for e in events:
        if not moves_rollout(e):
            continue
        if e.rollout_id and e.rollout_id.startswith("rollout-"):
            with contextlib.suppress(ValueError):
                rollout_id = int(e.rollout_id.removeprefix("rollout-"))
                wanted.setdefault(rollout_id, set()).add(e.device_id)
    rows: dict[tuple[int, str], RolloutDevice] = {}
    for rollout_id, wanted_ids in wanted.items():
        ids = sorted(wanted_ids)
        for start in range(0, len(ids), CHUNK):
            result = await session.execute(
                select(RolloutDevice).where(
                    RolloutDevice.rollout_id == rollout_id,
                    RolloutDevice.device_id.in_(ids[start : start + CHUNK]),
                )
            )
            rows |= {(rd.rollout_id, rd.device_id): rd for rd in result.scalars()}
    return rows


async def _reverting_for(
    session: AsyncSession, events: list[UpdateEvent]
) -> dict[tuple[str, str], list[RolloutDevice]]:
    """Rows waiting for the devices' answers to rollback commands, by (device, model)."""
    ids = {
        e.device_id
        for e in events
        if e.state in REFUSALS
        and e.code in ("fleet_command", "nothing_to_roll_back")
        and not (e.rollout_id and e.rollout_id.startswith("rollout-"))
    }
    out: dict[tuple[str, str], list[RolloutDevice]] = {}
    chunked = sorted(ids)
    for start in range(0, len(chunked), CHUNK):
        result = await session.execute(
            select(RolloutDevice, Rollout.model)
            .join(Rollout)
            .where(
                RolloutDevice.device_id.in_(chunked[start : start + CHUNK]),
                RolloutDevice.state == DeviceRolloutState.REVERTING,
            )
        )
        for rd, model in result:
            out.setdefault((rd.device_id, model), []).append(rd)
    return out


async def _apply_event(
    session: AsyncSession,
    event: UpdateEvent,
    prefetched: dict[tuple[int, str], RolloutDevice],
    reverting: dict[tuple[str, str], list[RolloutDevice]],
) -> int | None:
    state, now = event.state, datetime.now(UTC)
    if event.rollout_id and event.rollout_id.startswith("rollout-"):
        try:
            rollout_id = int(event.rollout_id.removeprefix("rollout-"))
        except ValueError:
            return None
        rd = prefetched.get((rollout_id, event.device_id))
        reason = _device_reason(event) if event.code else ""
        if (
            rd is not None
            and reason
            and rd.state in (DeviceRolloutState.PENDING, DeviceRolloutState.SENT)
        ):
            # a fault the device retries on its own (disk full, a download cut short):
            # shown on the rollout while the device is at it, without moving its state
            rd.reason, rd.updated_at = reason, now
        outcome = OUTCOMES.get(state)
        if rd is None or outcome is None:
            return None
        late = rd.state is DeviceRolloutState.REVERTED and rd.reason == NEVER_REPORTED
        if rd.state is DeviceRolloutState.REVERTING_PENDING or late:
            if (
                outcome is DeviceRolloutState.COMMITTED
            ):  # it got there after all: now it gets the command
                rd.state, rd.sent_at, rd.reason = (
                    DeviceRolloutState.REVERTING,
                    None,
                    "committed after the rollback started",
                )
                rollout = await session.get(Rollout, rollout_id)
                if rollout is not None and rollout.state is RolloutState.ROLLED_BACK:
                    rollout.state = RolloutState.ROLLING_BACK
            elif not late:
                rd.state, rd.reason = DeviceRolloutState.REVERTED, f"never switched ({reason})"
        elif rd.state is DeviceRolloutState.COMMITTED:
            pass  # a device does not un-commit: a later refusal of it is a repeat
        elif rd.state is DeviceRolloutState.WITHDRAWN:
            if outcome is DeviceRolloutState.COMMITTED:  # its window opened before it heard
                rd.state, rd.reason = outcome, SWITCHED_BEFORE_CANCEL
            elif not rd.reason.endswith(DROPPED):
                rd.reason += DROPPED  # what a withdrawal on the device reports
        elif rd.state in (
            DeviceRolloutState.PENDING,
            DeviceRolloutState.SENT,
            DeviceRolloutState.TIMED_OUT,
        ):
            rd.state, rd.reason = outcome, reason
        rd.updated_at = now
        return rollout_id
    if state in REFUSALS and event.code in (
        "fleet_command",
        "nothing_to_roll_back",
    ):
        rows = [
            rd
            for rd in reverting.get((event.device_id, event.model), [])
            if rd.state is DeviceRolloutState.REVERTING
        ]
        for rd in rows:
            rd.state, rd.reason = DeviceRolloutState.REVERTED, _device_reason(event)
            rd.updated_at = now
        return rows[0].rollout_id if rows else None
    return None


def _device_reason(event: UpdateEvent) -> str:
    """An event's code and reason, the reason cut to :data:`REASON_LIMIT` characters: it is
    the device's text, and it ends up in the rollout's own reason, the API and a
    ModelRollout's status (whose messages Kubernetes caps)."""
    reason = event.reason or ""
    if len(reason) > REASON_LIMIT:
        reason = reason[:REASON_LIMIT] + "... [truncated]"
    return f"{event.code}: {reason}"
