"""Cancelling a rollout: it stops where it is, and nothing it scheduled fires later.

What each device of a cancelled rollout is left with:

* **switched** (``committed``), or switching now (``sent`` without a maintenance window, or
  with one opening within :data:`WITHDRAW_MARGIN_S`): keeps the new version. Cancel rolls
  nothing back; ``abort`` does.
* **a switch scheduled** (``sent`` with its maintenance window opening later: it downloaded
  ahead and waits): *withdrawn*. Its desired state goes back to what it was before the
  rollout, the previous version's manifest signed again with a fresh validity (the same
  sequence, which the device passes over as the one it runs); a desired state that no longer
  lists the new manifest withdraws it on the device, which drops the staged files and reports
  it ``rejected (superseded)``: the switch never fires. A device offline meanwhile gets the
  retained desired state when it reconnects, before its window (by its clock) opens, or it
  switched already and reports the commit, which its row then shows.
* **shadowing** (a wave in its shadow phase, :mod:`.shadow`): the candidate is unloaded, as a
  rollback does (``reverted``, "shadow withdrawn").
* **not reached** (``pending``): ``skipped``.

NOTE: the margin keeps a device whose window opens as the cancel is sent (a clock a little
ahead of ours) from being told to withdraw what it is switching to already: such a device
keeps the new version, as any switching one does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import Rollout, RolloutDevice
from control_plane.db.session import required_utc
from control_plane.db.states import DeviceRolloutState
from control_plane.rollouts.rollback import Publish, Sign, redated, restore_desired
from control_plane.rollouts.shadow import WITHDRAWN as SHADOW_WITHDRAWN

WITHDRAW_MARGIN_S = 60.0
"""A scheduled switch less than this far ahead counts as under way (kept), not withdrawn."""
NOT_REACHED = "not reached before the cancel"


def scheduled(rd: RolloutDevice, now: datetime) -> bool:
    """Whether ``rd`` was sent its manifest with a switch scheduled after ``now`` (its
    maintenance window: ``sent_at`` is then the opening)."""
    return (
        rd.state is DeviceRolloutState.SENT
        and rd.sent_at is not None
        and required_utc(rd.sent_at) > now
    )


async def cancel_devices(
    session: AsyncSession,
    rollout: Rollout,
    now: datetime,
    *,
    sign: Sign,
    ttl_s: float,
    publish: Publish,
) -> None:
    """Move ``rollout``'s device rows as the module docstring says, restoring the desired
    states of the scheduled switches (published by ``publish`` once committed)."""
    redate = functools.partial(redated, now=now, ttl_s=ttl_s, sign=sign)
    margin = now + timedelta(seconds=WITHDRAW_MARGIN_S)
    for rd in rollout.devices:
        if rd.state is DeviceRolloutState.PENDING:
            rd.state, rd.reason, rd.updated_at = DeviceRolloutState.SKIPPED, NOT_REACHED, now
        elif scheduled(rd, margin):
            await restore_desired(session, rollout, rd, publish, redate)
            at = required_utc(rd.sent_at).isoformat()
            before = f"v{rd.previous_version}" if rd.previous_version else "no version"
            rd.state, rd.updated_at = DeviceRolloutState.WITHDRAWN, now
            rd.reason = f"switch at {at} withdrawn by the cancel: stays on {before}"


@dataclass(frozen=True)
class CancelOutcome:
    """What a cancel left on the rollout's devices (the API's ``cancelled``)."""

    withdrawn: int
    """Scheduled switches withdrawn: they never switch."""
    kept: int
    """Switched or switching: they keep the new version."""
    not_reached: int
    shadows: int
    """Shadows withdrawn: the candidate unloaded, never switched to."""
    other: int
    """Refused, rolled back on their own or timed out before the cancel."""

    @classmethod
    def of(cls, rollout: Rollout) -> CancelOutcome:
        states = [rd.state for rd in rollout.devices]
        withdrawn = states.count(DeviceRolloutState.WITHDRAWN)
        kept = states.count(DeviceRolloutState.COMMITTED) + states.count(DeviceRolloutState.SENT)
        skipped = states.count(DeviceRolloutState.SKIPPED)
        shadows = sum(
            rd.state is DeviceRolloutState.REVERTED and rd.reason == SHADOW_WITHDRAWN
            for rd in rollout.devices
        )
        other = len(states) - withdrawn - kept - skipped - shadows
        return cls(withdrawn, kept, skipped, shadows, other)

    def words(self, version: int) -> str:
        shadows = f", {self.shadows} shadow(s) unloaded" if self.shadows else ""
        return (
            f"{self.withdrawn} scheduled switch(es) withdrawn (those devices never switch), "
            f"{self.kept} device(s) switched or switching keep v{version} (abort rolls back), "
            f"{self.not_reached} not reached{shadows}"
        )

    def doc(self, version: int) -> dict[str, Any]:
        return {
            "withdrawn": self.withdrawn,
            "kept": self.kept,
            "not_reached": self.not_reached,
            "shadows": self.shadows,
            "other": self.other,
            "summary": self.words(version),
        }


def switch_doc(rollout: Rollout, rd: RolloutDevice, now: datetime) -> dict[str, Any] | None:
    """A device's switch that a rollout scheduled, for the device view: ``scheduled`` (it
    fires at ``at``) or ``withdrawn`` (it never will); None for any other row."""
    if rd.state is DeviceRolloutState.WITHDRAWN:
        state = "withdrawn"
    elif scheduled(rd, now):
        state = "scheduled"
    else:
        return None
    return {
        "rollout_id": rollout.id,
        "model": rollout.model,
        "version": rollout.version,
        "at": required_utc(rd.sent_at).isoformat(),
        "state": state,
        "reason": rd.reason,
    }


async def device_switches(
    session: AsyncSession, device_id: str, now: datetime
) -> list[dict[str, Any]]:
    """``device_id``'s switches scheduled or withdrawn (:func:`switch_doc`): of each model,
    as its latest rollout that reached the device left it."""
    rows = await session.execute(
        select(Rollout, RolloutDevice)
        .join(RolloutDevice, RolloutDevice.rollout_id == Rollout.id)
        .where(RolloutDevice.device_id == device_id)
        .order_by(Rollout.id.desc())
    )
    seen: set[str] = set()
    out = []
    for rollout, rd in rows:
        if rollout.model in seen or rd.state is DeviceRolloutState.PENDING:
            continue  # a newer rollout of the model decides; a pending row decides nothing
        seen.add(rollout.model)
        if (doc := switch_doc(rollout, rd, now)) is not None:
            out.append(doc)
    return out
