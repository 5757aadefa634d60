"""A rollout rolling back, a step at a time (the rollout engine's ``_roll_back``).

A device that committed the new version gets a signed rollback command that only acts if it
still runs that version (it keeps the previous version on disk); a device still in progress
gets the command when its commit is reported; every touched device's desired state goes back
to what it was before the rollout.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from common.protocol.agent_release import AgentReleaseManifest
from common.protocol.messages import ModelManifest
from control_plane.db.models import Device, Rollout, RolloutDevice
from control_plane.db.session import required_utc
from control_plane.db.states import REVERTING, DeviceRolloutState, RolloutState
from control_plane.mqtt.publisher import Publisher
from control_plane.rollouts.agent import KEPT, is_agent
from control_plane.rollouts.events import NEVER_REPORTED
from control_plane.rollouts.manifests import rollback_command
from control_plane.rollouts.sending import YIELD_EVERY, load_devices

log = logging.getLogger("edgefleet.control_plane.rollouts")

Sign = Callable[[BaseModel], dict[str, Any]]
"""Signs a wire message as the devices parse it (``KeyRing.sign_message``)."""
Publish = Callable[[Device], None]
Hold = Callable[[Callable[[], None]], None]
"""Keeps a publication until the step's transaction committed (the engine's ``_held``)."""


async def roll_back(
    session: AsyncSession,
    rollout: Rollout,
    now: datetime,
    *,
    resend: set[str],
    bus: Publisher,
    sign: Sign,
    publish: Publish,
    hold: Hold,
) -> bool:
    """One step of ``rollout``'s rollback: its devices' desired states restored, rollback
    commands sent (again, to the devices in ``resend``), timeouts counted. Whether every
    touched device is back (the rollout is then rolled back)."""
    timeout = timedelta(seconds=rollout.device_timeout_s)
    touched = (
        DeviceRolloutState.SENT,
        DeviceRolloutState.COMMITTED,
        DeviceRolloutState.TIMED_OUT,
    )
    restore = [rd.device_id for rd in rollout.devices if rd.state in touched]
    # an agent release's previous manifest must not reach the device expired: the device
    # verifies it again before it goes back (a model's restore needs no new window: it rolls
    # back on a command)
    ttl_s = max(rollout.device_timeout_s, 3600)
    redate = (
        functools.partial(redated, now=now, ttl_s=ttl_s, sign=sign) if is_agent(rollout) else None
    )
    loaded = await load_devices(session, restore)  # noqa: F841 (kept while used)
    for i, rd in enumerate(rollout.devices, 1):
        if i % YIELD_EVERY == 0:
            await asyncio.sleep(0)  # the lease renewed meanwhile (see YIELD_EVERY)
        if rd.state is DeviceRolloutState.PENDING:
            rd.state = DeviceRolloutState.SKIPPED
            rd.reason = "not reached before the rollback"
        elif rd.state in touched:
            await restore_desired(session, rollout, rd, publish, redate)
            # still applying, or silent (offline: its retained desired state still held the
            # new version until now): the command follows if it reports a commit
            if rd.state in (DeviceRolloutState.SENT, DeviceRolloutState.TIMED_OUT):
                rd.state = DeviceRolloutState.REVERTING_PENDING
                rd.reason = "desired state restored"
            elif is_agent(rollout) and rd.previous_desired is None:
                rd.state, rd.reason = DeviceRolloutState.REVERTED, KEPT
            else:
                # an agent release: the previous release's manifest, restored, takes it back
                agent = is_agent(rollout)
                rd.state, rd.sent_at = DeviceRolloutState.REVERTING, now if agent else None
            rd.updated_at = now
        if (
            rd.state is DeviceRolloutState.REVERTING
            and not is_agent(rollout)  # its restored desired state is what takes it back
            and (rd.sent_at is None or rd.device_id in resend)
        ):
            command = _command(rollout, rd, sign)
            hold(functools.partial(bus.publish_command, rd.device_id, command))
            if rd.sent_at is None:  # sent again: the timeout counts from the first send
                rd.sent_at = now
            rd.updated_at = now
        elif rd.state is DeviceRolloutState.REVERTING and required_utc(rd.sent_at) + timeout < now:
            rd.state, rd.reason = (
                DeviceRolloutState.REVERT_TIMED_OUT,
                "no answer to the rollback command in time",
            )
        elif (
            rd.state is DeviceRolloutState.REVERTING_PENDING
            and required_utc(rd.updated_at) + timeout < now
        ):
            # it never reported the new version; its desired state no longer holds it
            rd.state, rd.reason = DeviceRolloutState.REVERTED, NEVER_REPORTED
    if not [d for d in rollout.devices if d.state in REVERTING]:
        rollout.state = RolloutState.ROLLED_BACK
        log.warning("rollout rolled back", extra={"rollout": rollout.id, "reason": rollout.reason})
        return True
    return False


async def restore_desired(
    session: AsyncSession,
    rollout: Rollout,
    rd: RolloutDevice,
    publish: Publish,
    redate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """Give ``rd``'s device back the desired state it had before ``rollout``; ``redate``:
    the previous manifest signed again with a fresh validity (:func:`redated`)."""
    device = await session.get(Device, rd.device_id)
    if device is None:
        return
    desired = dict(device.desired)
    if rd.previous_desired:
        desired[rollout.model] = redate(rd.previous_desired) if redate else rd.previous_desired
    else:
        desired.pop(rollout.model, None)
    device.desired = desired
    publish(device)


def redated(envelope: dict[str, Any], now: datetime, ttl_s: float, sign: Sign) -> dict[str, Any]:
    """A signed manifest signed again as it was, sequence included, valid from ``now`` for
    ``ttl_s``: the previous version's manifest, kept since its rollout (maybe for longer than
    its lifetime), must not reach the device expired. A device that runs it passes it over as
    applied (its sequence is the one it committed: docs/protocol.md)."""
    signed = envelope["signed"]
    manifest: ModelManifest | AgentReleaseManifest = (
        AgentReleaseManifest.model_validate(signed)
        if signed.get("kind") == "agent_release"
        else ModelManifest.model_validate(signed)
    )
    return sign(
        manifest.model_copy(update={"issued_at": now, "expires_at": now + timedelta(seconds=ttl_s)})
    )


async def reverting_among(
    session: AsyncSession, rolling_back: set[int], device_ids: list[str]
) -> list[tuple[int, str]]:
    """(rollout, device) of ``device_ids`` that these rollbacks sent a command and still wait
    for."""
    rows = await session.execute(
        select(RolloutDevice.rollout_id, RolloutDevice.device_id).where(
            RolloutDevice.rollout_id.in_(rolling_back),
            RolloutDevice.state == DeviceRolloutState.REVERTING,
            RolloutDevice.sent_at.is_not(None),
            RolloutDevice.device_id.in_(device_ids),
        )
    )
    return [(rollout_id, device_id) for rollout_id, device_id in rows]


def _command(rollout: Rollout, rd: RolloutDevice, sign: Sign) -> dict[str, Any]:
    return sign(
        rollback_command(
            rd.device_id,
            rollout.model,
            rollout.version,
            f"rollout {rollout.id}: {rollout.reason}",
            datetime.now(UTC),
            ttl_s=max(rollout.device_timeout_s, 3600),
        )
    )
