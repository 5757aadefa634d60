"""A wave's manifests sent a chunk at a time.

The devices of a wave get their manifests in transactions of at most :data:`SEND_CHUNK`
devices, each committed and published before the next is signed (the rollout engine's
``_send_pending``). With the whole wave in one transaction, a wave of 20,000 devices held
the rollout's row and every device's row for the seconds it took to sign and write them all:
ingest on every replica waited behind it (its presence and ``last_seen`` updates touch the
same device rows), no device started before the last was signed, and a transaction that
outlived the leader's lease (its renewals wait for the event loop that the signing holds) was
refused whole at its fence and begun again from nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from common.protocol.agent_release import AgentReleaseManifest
from common.protocol.messages import ModelManifest
from control_plane.db.models import Device, Rollout, RolloutDevice
from control_plane.db.states import DeviceRolloutState, RolloutState
from control_plane.rollouts.agent import NO_LAUNCHER, for_agent_device, is_agent
from control_plane.rollouts.events import CHUNK
from control_plane.rollouts.manifests import for_device
from control_plane.rollouts.windows import held_devices, held_reason

SEND_CHUNK = 1000
"""Devices sent their manifest per transaction by default (``rollout_send_chunk_devices``):
about 0.3 s of signing and writing on the benchmark's host."""

YIELD_EVERY = 100
"""Devices handled between two turns given back to the event loop in a loop over a wave: a
loop over thousands of devices that never awaits I/O holds the loop for seconds, and the
leader's lease renewals with it, until its own fence finds the lease lapsed and refuses the
whole transaction (which is then begun again, and refused again)."""

Send = Callable[..., Awaitable[None]]
""":func:`send_manifest` with its signing and publishing bound (the engine's ``_send``):
``(session, rollout, row, now, base, *, activate_after=...)``."""
Sign = Callable[[ModelManifest | AgentReleaseManifest], dict[str, Any]]
Publish = Callable[[Device], None]
log = logging.getLogger("edgefleet.control_plane.rollouts")


async def pending_chunk(
    session: AsyncSession, rollout: Rollout, after: int, limit: int = SEND_CHUNK
) -> list[RolloutDevice]:
    """The next ``limit`` rows of the rollout's current wave still pending, past
    position ``after`` (devices a closed maintenance window holds stay pending: the next
    chunk starts after them)."""
    rows = await session.execute(
        select(RolloutDevice)
        .where(
            RolloutDevice.rollout_id == rollout.id,
            RolloutDevice.wave == rollout.current_wave,
            RolloutDevice.state == DeviceRolloutState.PENDING,
            RolloutDevice.position > after,
        )
        .order_by(RolloutDevice.position)
        .limit(limit)
    )
    return list(rows.scalars())


async def send_next_chunk(
    session: AsyncSession,
    rollout_id: int,
    after: int,
    *,
    send: Send,
    ttl_s: float,
    limit: int = SEND_CHUNK,
) -> list[RolloutDevice]:
    """One transaction of the engine's ``_send_pending``: the next ``limit`` pending devices of
    the rollout's current wave past position ``after`` (:func:`pending_chunk`) sent their
    manifests; none when the rollout is not running, or its step decides when its wave goes
    (a shadow phase)."""
    rollout = (
        await session.execute(select(Rollout).where(Rollout.id == rollout_id).with_for_update())
    ).scalar_one_or_none()
    if (
        rollout is None
        or rollout.state is not RolloutState.RUNNING
        or rollout.shadow is not None  # its step decides when the wave goes
    ):
        return []
    unsent = await pending_chunk(session, rollout, after, limit)
    if not unsent:
        return []
    now = datetime.now(UTC)
    await send_unsent(session, rollout, unsent, now, send=send, ttl_s=ttl_s, limit=limit)
    if rollout.wave_started_at is None:
        rollout.wave_started_at = now
        log.info("wave started", extra={"rollout": rollout.id, "wave": rollout.current_wave})
    rollout.updated_at = now
    return unsent


async def send_unsent(
    session: AsyncSession,
    rollout: Rollout,
    unsent: list[RolloutDevice],
    now: datetime,
    *,
    send: Send,
    ttl_s: float,
    limit: int = SEND_CHUNK,
) -> int:
    """Send ``unsent`` their manifests, as their maintenance windows let them start, at most
    ``limit`` of them; how many that leaves unsent for want of the limit (the caller steps
    again for those)."""
    held = await held_devices(session, [rd.device_id for rd in unsent], now)
    ready = [rd for rd in unsent if rd.device_id not in held]
    # valid when it opens; an agent release is not sent ahead: its launcher switches on receipt
    ahead = timedelta(seconds=0 if is_agent(rollout) else ttl_s / 2)
    early = [
        rd
        for rd in unsent
        if (opens := held.get(rd.device_id, ("", None))[1]) is not None and opens - now < ahead
    ]
    going = {rd.device_id for rd in (ready + early)[:limit]}
    loaded = await load_devices(session, sorted(going))
    base = stored_manifest(rollout)  # once, not once per device
    for i, rd in enumerate(unsent, 1):
        if i % YIELD_EVERY == 0:
            await asyncio.sleep(0)
        name, opens = held.get(rd.device_id, ("", None))
        if rd.device_id not in held:
            if rd.device_id in going:
                await send(session, rollout, rd, now, base)
        elif opens is not None and opens - now < ahead:
            if rd.device_id in going:
                # it downloads now and switches when the window opens (the device's clock)
                await send(session, rollout, rd, now, base, activate_after=opens)
                rd.reason = held_reason(name, opens, ahead=True)
        elif rd.reason != (reason := held_reason(name, opens)):
            rd.reason, rd.updated_at = reason, now
    del loaded
    return len(ready) + len(early) - len(going)


def stored_manifest(rollout: Rollout) -> ModelManifest | AgentReleaseManifest:
    """The rollout's manifest, validated as its kind."""
    if is_agent(rollout):
        return AgentReleaseManifest.model_validate(rollout.manifest)
    return ModelManifest.model_validate(rollout.manifest)


async def load_devices(session: AsyncSession, device_ids: list[str]) -> list[Device]:
    """Load these devices into the session in a few queries, so the ``session.get`` per device
    that follows finds them there instead of asking the database once per device. (The
    session's identity map holds objects weakly: keep the list while they are used.)"""
    devices: list[Device] = []
    for start in range(0, len(device_ids), CHUNK):
        chunk = device_ids[start : start + CHUNK]
        devices += (await session.execute(select(Device).where(Device.id.in_(chunk)))).scalars()
    return devices


async def send_manifest(
    session: AsyncSession,
    rollout: Rollout,
    rd: RolloutDevice,
    now: datetime,
    base: ModelManifest | AgentReleaseManifest | None = None,
    *,
    activate_after: datetime | None = None,
    sign: Sign,
    ttl_s: float,
    publish: Publish,
) -> None:
    """Send ``rd`` its manifest (``base``: the rollout's, validated once for a chunk);
    with ``activate_after``, its device timeout counts from then."""
    device = await session.get(Device, rd.device_id)
    if device is None:
        rd.state = DeviceRolloutState.TIMED_OUT
        rd.reason = "device no longer in the inventory"
        return
    manifest: ModelManifest | AgentReleaseManifest
    if is_agent(rollout):
        if device.launcher is None:  # it could not update itself: refused here, not waited on
            rd.state, rd.reason, rd.updated_at = DeviceRolloutState.REJECTED, NO_LAUNCHER, now
            return
        assert not isinstance(base, ModelManifest)
        manifest = for_agent_device(base or rollout.manifest, device.id, now, ttl_s)
    else:
        assert not isinstance(base, AgentReleaseManifest)
        manifest = for_device(
            base or rollout.manifest,
            device.id,
            now,
            ttl_s,
            activate_after=activate_after,
        )
    device.desired = {**device.desired, rollout.model: sign(manifest)}
    rd.state, rd.sent_at, rd.updated_at = DeviceRolloutState.SENT, activate_after or now, now
    publish(device)
