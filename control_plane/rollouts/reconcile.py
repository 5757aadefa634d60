"""A rollout's devices read back from what they last said they serve (their retained status),
at every step: an event lost while the control plane was down cannot leave a device hanging
(every step of the rollout engine begins with it)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import Device, Rollout, RolloutDevice
from control_plane.db.states import DeviceRolloutState
from control_plane.rollouts.agent import is_agent, reconcile_agent
from control_plane.rollouts.events import CHUNK
from control_plane.rollouts.sending import YIELD_EVERY


async def reconcile(session: AsyncSession, rollout: Rollout, now: datetime) -> None:
    """Read device states from what devices last said they serve (their retained status),
    so an event lost while the control plane was down cannot leave a device hanging."""
    waiting = [
        d
        for d in rollout.devices
        if d.state in (DeviceRolloutState.SENT, DeviceRolloutState.REVERTING)
    ]
    if not waiting:
        return
    # Only the column read here: whole Device rows would decode every desired state too,
    # on every step of a rollout over thousands of devices.
    ids = [w.device_id for w in waiting]
    if is_agent(rollout):
        await _reconcile_agent(session, rollout, waiting, now)
        return
    reported: dict[str, list[Any]] = {}
    for start in range(0, len(ids), CHUNK):  # a bound parameter per id: PostgreSQL takes 65,535
        rows = await session.execute(
            select(Device.id, Device.models).where(Device.id.in_(ids[start : start + CHUNK]))
        )
        reported |= {device_id: models for device_id, models in rows}
    for i, rd in enumerate(waiting, 1):
        if i % YIELD_EVERY == 0:
            await asyncio.sleep(0)
        models = reported.get(rd.device_id)
        if models is None:
            continue
        served = {(m["model"], m["version"]): m.get("sequence") for m in models}
        if (
            rd.state is DeviceRolloutState.SENT
            and served.get((rollout.model, rollout.version)) == rollout.sequence
        ):
            rd.state, rd.reason = DeviceRolloutState.COMMITTED, "seen in the device's status"
            rd.updated_at = now
        elif (
            rd.state is DeviceRolloutState.REVERTING
            and (rollout.model, rollout.version) not in served
            and (rd.previous_version is None or (rollout.model, rd.previous_version) in served)
        ):
            rd.state, rd.reason = DeviceRolloutState.REVERTED, "seen in the device's status"
            rd.updated_at = now


async def _reconcile_agent(
    session: AsyncSession, rollout: Rollout, waiting: list[RolloutDevice], now: datetime
) -> None:
    """An agent release's rows, from what each device's launcher last reported."""
    ids = [w.device_id for w in waiting]
    devices: dict[str, Device] = {}
    for start in range(0, len(ids), CHUNK):
        rows = await session.execute(
            select(Device).where(Device.id.in_(ids[start : start + CHUNK]))
        )
        devices |= {d.id: d for d in rows.scalars()}
    for i, rd in enumerate(waiting, 1):
        if i % YIELD_EVERY == 0:
            await asyncio.sleep(0)
        device = devices.get(rd.device_id)
        if device is not None:
            reconcile_agent(rollout, rd, device, now)
