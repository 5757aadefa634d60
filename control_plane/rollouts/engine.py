"""Staged rollouts: waves, bake times, health gates, fleet-wide rollback.

    running --(every wave passed its gates)--> succeeded
       |  ^
     pause resume         a gate fails, or abort
       v  |                      |
     paused                      v
                           rolling_back --(every touched device back)--> rolled_back
    (cancel: stop where it is, no rollback; scheduled switches withdrawn)  -> cancelled

All state lives in the database, so a restarted control plane picks every rollout up where it
was. Device events move device states at once; a periodic tick handles timers (device
timeouts, bake times). One lock serialises every transition in a process, and a row lock on
the rollout across replicas: any replica applies device events and operators' requests, one
(the leader, :mod:`control_plane.leadership`) steps rollouts, under its fencing epoch.

Judging a wave is :mod:`.waves`, rolling back :mod:`.rollback`, reading device states back
from their status :mod:`.reconcile`, the OpenTelemetry spans an operator follows a rollout by
:mod:`.tracing`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import selectinload

from common.protocol.messages import UpdateEvent
from control_plane.db.models import Device, Rollout
from control_plane.db.states import ACTIVE, DeviceRolloutState, RolloutState
from control_plane.errors import Conflict, NotFound
from control_plane.leadership.lease import Fenced, Leadership
from control_plane.metrics import FleetMetrics
from control_plane.mqtt.publisher import Publisher
from control_plane.rollouts.cancel import cancel_devices
from control_plane.rollouts.events import CHUNK, apply_events, moves_rollout
from control_plane.rollouts.plan import plan_rollout
from control_plane.rollouts.reconcile import reconcile
from control_plane.rollouts.rollback import reverting_among, roll_back
from control_plane.rollouts.sending import (
    SEND_CHUNK,
    Send,
    send_manifest,
    send_next_chunk,
    send_unsent,
)
from control_plane.rollouts.shadow import shadow_wave, withdraw_shadows
from control_plane.rollouts.spec import Gates, RolloutSpec
from control_plane.rollouts.tracing import RolloutSpans
from control_plane.rollouts.waves import fail, judge_wave
from control_plane.signing.keys import KeyRing

log = logging.getLogger("edgefleet.control_plane.rollouts")
STEP_SPACING = 3.0
"""The loop steps a rollout again (for its events, on a tick) no sooner than this many times
its last step's duration after that step: a step reads the whole rollout, and at tens of
thousands of devices takes a second or more, so back to back the steps would hold the
leader's event loop (its ingest, its lease renewals) and the rollout's row most of the time.
Small rollouts' steps take milliseconds: this spaces them no further."""


class RolloutEngine:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        bus: Publisher,
        keys: KeyRing,
        metrics: FleetMetrics,
        *,
        manifest_ttl_s: float,
        artifact_base_url: str,
        tick_s: float,
        leadership: Leadership,
        send_chunk: int = SEND_CHUNK,
        spans: RolloutSpans | None = None,
    ) -> None:
        """``leadership``: this engine's loop runs on the replica that leads (see
        :mod:`control_plane.leadership`); its steps commit only under the leader's epoch.
        ``send_chunk``: devices sent their manifests per transaction
        (:mod:`control_plane.rollouts.sending`). ``spans``: the rollouts' OpenTelemetry
        spans (:mod:`.tracing`); none: not traced."""
        self.spans = spans or RolloutSpans()
        self.sessions = sessions
        self.leadership = leadership
        self.bus = bus
        self.keys = keys
        self.metrics = metrics
        self.manifest_ttl_s = manifest_ttl_s
        self.artifact_base_url = artifact_base_url
        self.tick_s = tick_s
        self.send_chunk = send_chunk
        self._lock = asyncio.Lock()
        self._dirty: set[int] = set()
        """Rollouts that device events moved since their last step."""
        self._wake = asyncio.Event()
        self._rolling_back: set[int] = set()
        """Rollouts rolling back, as their last step saw (births matter only while any is)."""
        self._births: set[str] = set()
        """Devices that announced themselves since the loop last looked (:meth:`on_births`)."""
        self._resend: dict[int, set[str]] = {}
        """Per rollout, the devices whose rollback command its next step sends again."""
        self._held: list[Callable[[], None]] = []
        """What the step in progress publishes, sent once its transaction committed."""
        self._rest_until: dict[int, float] = {}
        """Per rollout, the ``time.monotonic()`` before which the loop does not step it again
        (:data:`STEP_SPACING`)."""
        self._send: Send = functools.partial(
            send_manifest,
            sign=keys.sign_message,
            ttl_s=manifest_ttl_s,
            publish=self._publish_desired,
        )
        """Sends a device its manifest, published once the step's transaction commits."""

    # -- operator actions -------------------------------------------------------------------

    async def create(
        self,
        spec: RolloutSpec,
        user: str,
        *,
        only: Collection[str] | None = None,
        deployment_id: int | None = None,
        fenced: bool = False,
    ) -> int:
        """Plan and start a rollout (see :func:`plan_rollout` for ``only`` and
        ``deployment_id``); return its id. ``fenced``: for a leader's loop (the deployments
        reconciler), refused (:class:`Fenced`) unless this replica leads."""
        async with self._lock, self.sessions.begin() as session:
            rollout_id = await plan_rollout(
                session,
                spec,
                user,
                artifact_base_url=self.artifact_base_url,
                manifest_ttl_s=self.manifest_ttl_s,
                only=only,
                deployment_id=deployment_id,
            )
            rollout = await session.get(Rollout, rollout_id)
            if rollout is not None:  # its span, under the current one (the API call's)
                self.spans.begin(rollout)
            if fenced:
                await self.leadership.fence(session)
        await self._step_if_leading(rollout_id)
        return rollout_id

    async def _step_if_leading(self, rollout_id: int) -> None:
        """Step at once on the leader, with the first chunk of a wave's manifests (the loop
        sends the rest: an operator's request does not wait for a whole wave's signatures);
        on another replica (an operator's request it serves), the leader's next tick steps
        it."""
        if self.leadership.leading:
            with contextlib.suppress(Fenced):
                await self.step(rollout_id, chunks=1)

    async def pause(self, rollout_id: int, user: str | None = None) -> None:
        await self._transition(rollout_id, {RolloutState.RUNNING}, RolloutState.PAUSED, user=user)

    async def resume(self, rollout_id: int, user: str | None = None) -> None:
        await self._transition(rollout_id, {RolloutState.PAUSED}, RolloutState.RUNNING, user=user)
        await self._step_if_leading(rollout_id)

    async def cancel(self, rollout_id: int, user: str) -> None:
        """Stop the rollout where it is: switched devices keep the new version, scheduled
        switches and shadows are withdrawn, the devices not reached are skipped
        (:mod:`.cancel`). Any replica serves it, as it serves the other operator actions: not
        fenced."""
        held: list[tuple[str, list[dict[str, Any]]]] = []
        exports: list[Callable[[], None]] = []  # its spans, also once committed

        def hold(device: Device) -> None:  # published once committed, as a step's are
            held.append((device.id, list(device.desired.values())))

        async with self._lock, self.sessions.begin() as session:
            rollout = await _locked(session, rollout_id)
            if rollout is None:
                raise NotFound(f"no rollout {rollout_id}")
            if rollout.state not in (RolloutState.RUNNING, RolloutState.PAUSED):
                raise Conflict(
                    f"rollout {rollout_id} is {rollout.state}; cannot go to "
                    f"{RolloutState.CANCELLED}"
                )
            now = datetime.now(UTC)
            # a wave in its shadow phase: its candidates are unloaded, never switched to
            await withdraw_shadows(session, rollout, now, hold)
            await cancel_devices(
                session,
                rollout,
                now,
                sign=self.keys.sign_message,
                ttl_s=self.manifest_ttl_s,
                publish=hold,
            )
            rollout.state, rollout.reason = RolloutState.CANCELLED, f"cancelled by {user}"
            rollout.updated_at = now
            self.spans.action(rollout, user, now, exports.append)
            self.spans.ended(rollout, now, exports.append)
        for device_id, manifests in held:
            self.bus.publish_desired(device_id, manifests)
        for export in exports:
            export()
        log.info(
            "rollout state",
            extra={"rollout": rollout_id, "state": RolloutState.CANCELLED, "withdrawn": len(held)},
        )

    async def abort(self, rollout_id: int, user: str) -> None:
        await self._transition(
            rollout_id,
            {RolloutState.RUNNING, RolloutState.PAUSED},
            RolloutState.ROLLING_BACK,
            f"aborted by {user}",
            user=user,
        )
        await self._step_if_leading(rollout_id)

    async def _transition(
        self,
        rollout_id: int,
        allowed: set[RolloutState],
        to: RolloutState,
        reason: str = "",
        *,
        user: str | None = None,
    ) -> None:
        exports: list[Callable[[], None]] = []  # its span, once committed
        async with self._lock, self.sessions.begin() as session:
            # locked: the leader's step and another replica's request must not interleave
            rollout = await session.get(Rollout, rollout_id, with_for_update=True)
            if rollout is None:
                raise NotFound(f"no rollout {rollout_id}")
            if rollout.state not in allowed:
                raise Conflict(f"rollout {rollout_id} is {rollout.state}; cannot go to {to}")
            rollout.state = to
            rollout.reason = reason or rollout.reason
            rollout.updated_at = now = datetime.now(UTC)
            self.spans.action(rollout, user, now, exports.append)
        for export in exports:
            export()
        log.info("rollout state", extra={"rollout": rollout_id, "state": to, "reason": reason})

    # -- the loop ---------------------------------------------------------------------------

    async def republish_desired(self) -> None:
        """Publish every device's desired state again (retained): at start, and when the broker
        lost what it retained."""
        async with self.sessions() as session:
            devices = (await session.execute(select(Device))).scalars().all()
        for device in devices:  # (JSON has no equality operator in PostgreSQL: filter here)
            if device.desired:
                self.bus.publish_desired(device.id, list(device.desired.values()))

    def on_births(self, device_ids: list[str]) -> None:
        """Devices said they are online (a birth message, at every connect). One that a rollback
        still waits for gets its command again, now that it is subscribed: the first may be
        lost, with the broker's state (queued for it there, or published before its session
        existed on a new broker: every device reconnects after a broker reset, and its retained
        birth reaches the control plane again) or in the device's crash (a device records a
        command only once it ran). A device that gets it twice rejects the second
        (``nothing_to_roll_back``), which leaves its row as the first answer put it. The
        rollback's device timeout still counts from the first send."""
        if self._rolling_back:
            self._births.update(device_ids)
            self._wake.set()

    async def _resend_on_births(self, births: set[str]) -> None:
        ids = sorted(births)
        for start in range(0, len(ids), CHUNK):
            async with self.sessions() as session:
                rows = await reverting_among(
                    session, self._rolling_back, ids[start : start + CHUNK]
                )
                for rollout_id, device_id in rows:
                    self._resend.setdefault(rollout_id, set()).add(device_id)
                    self._dirty.add(rollout_id)

    async def run(self) -> None:
        """Republish what devices should run, then advance active rollouts on every tick."""
        await self.republish_desired()
        next_tick = time.monotonic()
        while True:
            self._wake.clear()
            births, self._births = self._births, set()
            try:
                if births and self._rolling_back:
                    await self._resend_on_births(births)
            except Exception:
                self._births |= births  # the database away: looked at again next time
                log.exception("rollback commands not sent again")
            dirty, self._dirty = self._dirty, set()
            try:
                if time.monotonic() >= next_tick:  # timers: bake times and device timeouts
                    next_tick = time.monotonic() + self.tick_s
                    await self._tick()
                else:
                    for rollout_id in sorted(dirty):
                        if self._resting(rollout_id):
                            self._dirty.add(rollout_id)  # stepped once it has rested
                        else:
                            await self._step_logged(rollout_id)
            except Exception:
                # the database restarting must not end the loop: the next tick tries again
                log.exception("rollout tick failed")
            # a step reads the whole rollout: at most two a tick, whatever the event rate
            await asyncio.sleep(min(self.tick_s / 2, max(0.0, next_tick - time.monotonic())))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_tick - time.monotonic())):
                    await self._wake.wait()

    async def _step_logged(self, rollout_id: int) -> None:
        try:
            await self.step(rollout_id)
        except Fenced as exc:  # another replica leads now: its loop takes the rollout on
            log.warning("rollout step refused", extra={"rollout": rollout_id, "reason": str(exc)})
        except Exception:
            log.exception("rollout step failed", extra={"rollout": rollout_id})

    async def _tick(self) -> None:
        async with self.sessions() as session:
            ids = (
                (await session.execute(select(Rollout.id).where(Rollout.state.in_(ACTIVE))))
                .scalars()
                .all()
            )
        for rollout_id in ids:
            if not self._resting(rollout_id):
                await self._step_logged(rollout_id)
        await self._count_states()

    def _resting(self, rollout_id: int) -> bool:
        return time.monotonic() < self._rest_until.get(rollout_id, 0.0)

    async def _count_states(self) -> None:
        async with self.sessions() as session:
            rows = (
                await session.execute(select(Rollout.state, func.count()).group_by(Rollout.state))
            ).all()
        self.metrics.rollout_states = {state: n for state, n in rows}

    async def on_device_online(self, device_id: str) -> None:
        """A device came back: make sure it has its desired state (retried until timeout)."""
        async with self.sessions() as session:
            device = await session.get(Device, device_id)
        if device is not None and device.desired:
            self.bus.publish_desired(device.id, list(device.desired.values()))

    async def on_events(self, events: list[UpdateEvent]) -> None:
        events = [e for e in events if moves_rollout(e)]
        if not events:
            return
        async with self._lock, self.sessions.begin() as session:
            # Any replica ingests events: their rollouts' rows are locked first, in one order,
            # so a step on the leader and these writes take turns.
            await session.execute(
                select(Rollout.id)
                .where(Rollout.id.in_(_rollout_ids(events)))
                .order_by(Rollout.id)
                .with_for_update()
            )
            touched = await apply_events(session, events)
        # The rollout loop steps them, once for all the events that arrive meanwhile: a step
        # reads the whole rollout, and one per ingest batch held ingest up behind it.
        if touched:
            self._dirty |= touched
            self._wake.set()

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncSession]:
        """A step's transaction (under the lock). What it publishes (desired states, rollback
        commands) goes out only once it committed: published first, a device could act on a
        manifest the database, after a failed commit or a crash, says was never sent, and a
        rollback would then skip it and restore nothing. A step that fails publishes nothing
        and is tried again whole."""
        self._held = []
        try:
            async with self.sessions.begin() as session:
                yield session
                # last: a stale leader's step is dropped whole, unwritten and unpublished
                await self.leadership.fence(session)
            for publish in self._held:
                publish()
        finally:
            self._held = []

    async def step(self, rollout_id: int, *, chunks: int | None = None) -> None:
        """Send the current wave's pending devices their manifests, then step the rollout.
        ``chunks``: send at most that many chunks; if devices are left, the loop sends them
        and steps the rollout then."""
        if await self._send_pending(rollout_id, chunks):
            self._dirty.add(rollout_id)
            self._wake.set()
            return
        started = time.monotonic()
        try:
            await self._step(rollout_id)
        finally:
            ended = time.monotonic()
            self._rest_until[rollout_id] = ended + STEP_SPACING * (ended - started)

    async def _send_pending(self, rollout_id: int, chunks: int | None = None) -> bool:
        """Send the current wave's pending devices their manifests, ``send_chunk`` to a
        transaction, each committed and published before the next (see
        :mod:`control_plane.rollouts.sending`); the step that follows finds them sent.
        Whether it stopped at ``chunks`` chunks with devices maybe left."""
        after, sent = -1, 0
        while True:
            async with self._lock, self._transaction() as session:
                unsent = await send_next_chunk(
                    session,
                    rollout_id,
                    after,
                    send=self._send,
                    ttl_s=self.manifest_ttl_s,
                    limit=self.send_chunk,
                )
            if not unsent or len(unsent) < self.send_chunk:
                return False
            after, sent = unsent[-1].position, sent + 1
            if chunks is not None and sent >= chunks:
                return True

    async def _step(self, rollout_id: int) -> None:
        async with self._lock, self._transaction() as session:
            rollout = await _locked(session, rollout_id)
            if rollout is None or rollout.state not in ACTIVE:
                return
            now = datetime.now(UTC)
            await reconcile(session, rollout, now)
            if rollout.state is RolloutState.RUNNING:
                await self._run_waves(session, rollout, now)
            if rollout.state is RolloutState.ROLLING_BACK:
                await self._roll_back(session, rollout, now)
            rollout.updated_at = now

    # -- running ----------------------------------------------------------------------------

    async def _run_waves(self, session: AsyncSession, rollout: Rollout, now: datetime) -> None:
        gates = Gates.model_validate(rollout.gates)
        wave_devices = [d for d in rollout.devices if d.wave == rollout.current_wave]
        self.spans.wave(rollout, wave_devices, now)
        unsent = [rd for rd in wave_devices if rd.state is DeviceRolloutState.PENDING]
        if unsent and rollout.shadow is not None:  # the wave meets live inputs unswitched first
            hold, verdict = await shadow_wave(
                session,
                rollout,
                wave_devices,
                now,
                sign=self.keys.sign_message,
                publish=self._publish_desired,
                ttl_s=self.manifest_ttl_s,
            )
            self.spans.shadow(rollout, now, self._held.append)
            if verdict is not None:
                return fail(rollout, verdict)
            if hold:
                return None
        if unsent:  # the wave's devices, as their maintenance windows let them start
            left = await send_unsent(
                session,
                rollout,
                unsent,
                now,
                send=self._send,
                ttl_s=self.manifest_ttl_s,
                limit=self.send_chunk,
            )
            if left:  # a wave begun in this step: the next step's chunks send the rest
                self._dirty.add(rollout.id)
                self._wake.set()
        if rollout.wave_started_at is None:
            rollout.wave_started_at = now
            log.info(
                "wave started",
                extra={
                    "rollout": rollout.id,
                    "wave": rollout.current_wave,
                    "devices": len(wave_devices),
                },
            )
        wave, baked_from = rollout.current_wave, rollout.bake_started_at
        moved_on = await judge_wave(session, rollout, gates, wave_devices, now)
        self.spans.judged(rollout, wave, baked_from, now, self._held.append)
        if moved_on:
            await self._run_waves(session, rollout, now)
        return None

    def _publish_desired(self, device: Device) -> None:
        """Publish ``device``'s desired state once the step's transaction commits."""
        self._held.append(
            functools.partial(self.bus.publish_desired, device.id, list(device.desired.values()))
        )

    # -- rolling back -----------------------------------------------------------------------

    async def _roll_back(self, session: AsyncSession, rollout: Rollout, now: datetime) -> None:
        self.spans.rollback(rollout, now, self._held.append)
        await withdraw_shadows(session, rollout, now, self._publish_desired)
        resend = self._resend.pop(rollout.id, set())
        self._rolling_back.add(rollout.id)
        rolled_back = await roll_back(
            session,
            rollout,
            now,
            resend=resend,
            bus=self.bus,
            sign=self.keys.sign_message,
            publish=self._publish_desired,
            hold=self._held.append,
        )
        if rolled_back:
            self._rolling_back.discard(rollout.id)
            self.spans.ended(rollout, now, self._held.append)


async def _locked(session: AsyncSession, rollout_id: int) -> Rollout | None:
    """The rollout with its devices, its row locked for the transaction (PostgreSQL)."""
    query = (
        select(Rollout)
        .where(Rollout.id == rollout_id)
        .options(selectinload(Rollout.devices))
        .with_for_update()
    )
    return (await session.execute(query)).scalar_one_or_none()


def _rollout_ids(events: list[UpdateEvent]) -> list[int]:
    """The rollouts ``events`` name (``rollout-<id>``)."""
    ids: set[int] = set()
    for e in events:
        if e.rollout_id and e.rollout_id.startswith("rollout-"):
            with contextlib.suppress(ValueError):
                ids.add(int(e.rollout_id.removeprefix("rollout-")))
    return sorted(ids)
