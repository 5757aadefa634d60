"""Staged rollouts: waves, bake times, health gates, fleet-wide rollback.

    running --(every wave passed its gates)--> succeeded
       |  ^
     pause resume         a gate fails, or abort
       v  |                      |
     paused                      v
                           rolling_back --(every touched device back)--> rolled_back
    (cancel: stop where it is, no rollback)  -> cancelled

All state lives in the database, so a restarted control plane picks every rollout up where it
was. Device events move device states at once; a periodic tick handles timers (device
timeouts, bake times). One lock serialises every transition in a process, and a row lock on
the rollout across replicas: any replica applies device events and operators' requests, one
(the leader, :mod:`control_plane.leadership`) steps rollouts, under its fencing epoch.

Rolling back: a device that committed the new version gets a signed rollback command that
only acts if it still runs that version (it keeps the previous version on disk); a device
still in progress gets the command when its commit is reported; every touched device's
desired state goes back to what it was before the rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import selectinload

from common.protocol.messages import ModelManifest, UpdateEvent
from control_plane.db.models import Device, Rollout, RolloutDevice
from control_plane.db.session import required_utc
from control_plane.errors import Conflict, NotFound
from control_plane.leadership.lease import Fenced, Leadership
from control_plane.metrics import FleetMetrics
from control_plane.mqtt.bus import FleetBus
from control_plane.rollouts.events import CHUNK, NEVER_REPORTED, apply_events, moves_rollout
from control_plane.rollouts.gates import drift_gate, telemetry_gates
from control_plane.rollouts.manifests import for_device, rollback_command
from control_plane.rollouts.plan import plan_rollout
from control_plane.rollouts.sending import (
    SEND_CHUNK,
    YIELD_EVERY,
    load_devices,
    pending_chunk,
    send_unsent,
)
from control_plane.rollouts.shadow import shadow_wave, withdraw_shadows
from control_plane.rollouts.spec import Gates, RolloutSpec
from control_plane.rollouts.states import (
    ACTIVE,
    FAILED,
    REVERTING,
    WAVE_DONE,
    DeviceRolloutState,
    RolloutState,
)
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
        bus: FleetBus,
        keys: KeyRing,
        metrics: FleetMetrics,
        *,
        manifest_ttl_s: float,
        artifact_base_url: str,
        tick_s: float,
        leadership: Leadership,
        send_chunk: int = SEND_CHUNK,
    ) -> None:
        """``leadership``: this engine's loop runs on the replica that leads (see
        :mod:`control_plane.leadership`); its steps commit only under the leader's epoch.
        ``send_chunk``: devices sent their manifests per transaction
        (:mod:`control_plane.rollouts.sending`)."""
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

    async def pause(self, rollout_id: int) -> None:
        await self._transition(rollout_id, {RolloutState.RUNNING}, RolloutState.PAUSED)

    async def resume(self, rollout_id: int) -> None:
        await self._transition(rollout_id, {RolloutState.PAUSED}, RolloutState.RUNNING)
        await self._step_if_leading(rollout_id)

    async def cancel(self, rollout_id: int, user: str) -> None:
        await self._transition(
            rollout_id,
            {RolloutState.RUNNING, RolloutState.PAUSED},
            RolloutState.CANCELLED,
            f"cancelled by {user}",
        )

    async def abort(self, rollout_id: int, user: str) -> None:
        await self._transition(
            rollout_id,
            {RolloutState.RUNNING, RolloutState.PAUSED},
            RolloutState.ROLLING_BACK,
            f"aborted by {user}",
        )
        await self._step_if_leading(rollout_id)

    async def _transition(
        self,
        rollout_id: int,
        allowed: set[RolloutState],
        to: RolloutState,
        reason: str = "",
    ) -> None:
        async with self._lock, self.sessions.begin() as session:
            # locked: the leader's step and another replica's request must not interleave
            rollout = await session.get(Rollout, rollout_id, with_for_update=True)
            if rollout is None:
                raise NotFound(f"no rollout {rollout_id}")
            if rollout.state not in allowed:
                raise Conflict(f"rollout {rollout_id} is {rollout.state}; cannot go to {to}")
            rollout.state = to
            rollout.reason = reason or rollout.reason
            rollout.updated_at = datetime.now(UTC)
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
                rows = await session.execute(
                    select(RolloutDevice.rollout_id, RolloutDevice.device_id).where(
                        RolloutDevice.rollout_id.in_(self._rolling_back),
                        RolloutDevice.state == DeviceRolloutState.REVERTING,
                        RolloutDevice.sent_at.is_not(None),
                        RolloutDevice.device_id.in_(ids[start : start + CHUNK]),
                    )
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
                rollout = (
                    await session.execute(
                        select(Rollout).where(Rollout.id == rollout_id).with_for_update()
                    )
                ).scalar_one_or_none()
                if (
                    rollout is None
                    or rollout.state is not RolloutState.RUNNING
                    or rollout.shadow is not None  # its step decides when the wave goes
                ):
                    return False
                unsent = await pending_chunk(session, rollout, after, self.send_chunk)
                if not unsent:
                    return False
                now = datetime.now(UTC)
                await send_unsent(
                    session,
                    rollout,
                    unsent,
                    now,
                    send=self._send,
                    ttl_s=self.manifest_ttl_s,
                    limit=self.send_chunk,
                )
                if rollout.wave_started_at is None:
                    rollout.wave_started_at = now
                    log.info(
                        "wave started",
                        extra={"rollout": rollout.id, "wave": rollout.current_wave},
                    )
                rollout.updated_at = now
            if len(unsent) < self.send_chunk:
                return False
            after, sent = unsent[-1].position, sent + 1
            if chunks is not None and sent >= chunks:
                return True

    async def _step(self, rollout_id: int) -> None:
        async with self._lock, self._transaction() as session:
            rollout = (
                await session.execute(
                    select(Rollout)
                    .where(Rollout.id == rollout_id)
                    .options(selectinload(Rollout.devices))
                    .with_for_update()
                )
            ).scalar_one_or_none()
            if rollout is None or rollout.state not in ACTIVE:
                return
            now = datetime.now(UTC)
            await self._reconcile(session, rollout, now)
            if rollout.state is RolloutState.RUNNING:
                await self._run_waves(session, rollout, now)
            if rollout.state is RolloutState.ROLLING_BACK:
                await self._roll_back(session, rollout, now)
            rollout.updated_at = now

    async def _reconcile(self, session: AsyncSession, rollout: Rollout, now: datetime) -> None:
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

    # -- running ----------------------------------------------------------------------------

    async def _run_waves(self, session: AsyncSession, rollout: Rollout, now: datetime) -> None:
        gates = Gates.model_validate(rollout.gates)
        wave_devices = [d for d in rollout.devices if d.wave == rollout.current_wave]
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
            if verdict is not None:
                return self._fail(rollout, verdict)
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
            return self._fail(
                rollout, f"self-test failed on {self_test[0].device_id}: {self_test[0].reason}"
            )
        if len(failed) > gates.max_rejections:
            return self._fail(
                rollout,
                f"{len(failed)} device(s) refused or rolled back the update "
                f"(allowed {gates.max_rejections}); "
                f"first: {failed[0].device_id}: {failed[0].reason}",
            )
        if any(d.state not in WAVE_DONE for d in wave_devices):
            return None
        if wave_devices and not any(d.state is DeviceRolloutState.COMMITTED for d in wave_devices):
            # No evidence the version works anywhere (every device timed out, or refused within
            # max_rejections): going on would roll it out wider blind. A dead artifact URL or a
            # broker that refuses the devices' topics looks exactly like this.
            timed_out = sum(d.state is DeviceRolloutState.TIMED_OUT for d in wave_devices)
            return self._fail(
                rollout,
                f"no device of wave {rollout.current_wave + 1} committed the update "
                f"({timed_out} timed out, {len(wave_devices) - timed_out} refused it)",
            )
        if rollout.bake_started_at is None:
            rollout.bake_started_at = now
        verdict, report = await telemetry_gates(session, rollout, gates, touched, now)
        baked = required_utc(rollout.bake_started_at) + timedelta(seconds=rollout.bake_time_s)
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
        before = rollout.gate_report.get(str(rollout.current_wave), {}).get("drift")
        pause, drift = await drift_gate(session, rollout, gates, touched, before)
        if drift is not None:
            report["drift"] = drift
        rollout.gate_report = {**rollout.gate_report, str(rollout.current_wave): report}
        if verdict:
            return self._fail(rollout, verdict)
        if pause:  # the data moved, not the version: an operator decides, nothing rolls back
            rollout.state, rollout.reason = RolloutState.PAUSED, pause
            log.warning("rollout paused by its drift gate", extra={"rollout": rollout.id})
            return None
        if baked > now or waiting:
            return None  # still baking, or waiting for requests to judge
        if rollout.current_wave + 1 >= len(rollout.waves) or not [
            d for d in rollout.devices if d.wave > rollout.current_wave
        ]:
            rollout.state, rollout.reason = (
                RolloutState.SUCCEEDED,
                f"all {len(rollout.waves)} waves passed their gates",
            )
            log.info("rollout succeeded", extra={"rollout": rollout.id})
            return None
        rollout.current_wave += 1
        rollout.wave_started_at = rollout.bake_started_at = None
        await self._run_waves(session, rollout, now)
        return None

    def _fail(self, rollout: Rollout, reason: str) -> None:
        rollout.state, rollout.reason = RolloutState.ROLLING_BACK, reason
        log.warning(
            "rollout gate failed: rolling back", extra={"rollout": rollout.id, "reason": reason}
        )

    async def _send(
        self,
        session: AsyncSession,
        rollout: Rollout,
        rd: RolloutDevice,
        now: datetime,
        base: ModelManifest | None = None,
        *,
        activate_after: datetime | None = None,
    ) -> None:
        """Send ``rd`` its manifest (``base``: the rollout's, validated once for a chunk);
        with ``activate_after``, its device timeout counts from then."""
        device = await session.get(Device, rd.device_id)
        if device is None:
            rd.state = DeviceRolloutState.TIMED_OUT
            rd.reason = "device no longer in the inventory"
            return
        manifest = for_device(
            base or rollout.manifest,
            device.id,
            now,
            self.manifest_ttl_s,
            activate_after=activate_after,
        )
        device.desired = {**device.desired, rollout.model: self.keys.sign_message(manifest)}
        rd.state, rd.sent_at, rd.updated_at = DeviceRolloutState.SENT, activate_after or now, now
        self._publish_desired(device)

    def _publish_desired(self, device: Device) -> None:
        """Publish ``device``'s desired state once the step's transaction commits."""
        self._held.append(
            functools.partial(self.bus.publish_desired, device.id, list(device.desired.values()))
        )

    # -- rolling back -----------------------------------------------------------------------

    async def _roll_back(self, session: AsyncSession, rollout: Rollout, now: datetime) -> None:
        timeout = timedelta(seconds=rollout.device_timeout_s)
        touched = (
            DeviceRolloutState.SENT,
            DeviceRolloutState.COMMITTED,
            DeviceRolloutState.TIMED_OUT,
        )
        await withdraw_shadows(session, rollout, now, self._publish_desired)
        restore = [rd.device_id for rd in rollout.devices if rd.state in touched]
        resend = self._resend.pop(rollout.id, set())
        self._rolling_back.add(rollout.id)
        loaded = await load_devices(session, restore)  # noqa: F841 (kept while used)
        for i, rd in enumerate(rollout.devices, 1):
            if i % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # the lease renewed meanwhile (see YIELD_EVERY)
            if rd.state is DeviceRolloutState.PENDING:
                rd.state = DeviceRolloutState.SKIPPED
                rd.reason = "not reached before the rollback"
            elif rd.state in touched:
                await self._restore_desired(session, rollout, rd)
                # still applying, or silent (offline: its retained desired state still held the
                # new version until now): the command follows if it reports a commit
                if rd.state in (DeviceRolloutState.SENT, DeviceRolloutState.TIMED_OUT):
                    rd.state = DeviceRolloutState.REVERTING_PENDING
                    rd.reason = "desired state restored"
                else:
                    rd.state, rd.sent_at = DeviceRolloutState.REVERTING, None
                rd.updated_at = now
            if rd.state is DeviceRolloutState.REVERTING and (
                rd.sent_at is None or rd.device_id in resend
            ):
                command = self._command(rollout, rd)
                self._held.append(
                    functools.partial(self.bus.publish_command, rd.device_id, command)
                )
                if rd.sent_at is None:  # sent again: the timeout counts from the first send
                    rd.sent_at = now
                rd.updated_at = now
            elif (
                rd.state is DeviceRolloutState.REVERTING
                and required_utc(rd.sent_at) + timeout < now
            ):
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
            self._rolling_back.discard(rollout.id)
            log.warning(
                "rollout rolled back", extra={"rollout": rollout.id, "reason": rollout.reason}
            )

    async def _restore_desired(
        self, session: AsyncSession, rollout: Rollout, rd: RolloutDevice
    ) -> None:
        device = await session.get(Device, rd.device_id)
        if device is None:
            return
        desired = dict(device.desired)
        if rd.previous_desired:
            desired[rollout.model] = rd.previous_desired
        else:
            desired.pop(rollout.model, None)
        device.desired = desired
        self._publish_desired(device)

    def _command(self, rollout: Rollout, rd: RolloutDevice) -> dict[str, Any]:
        return self.keys.sign_message(
            rollback_command(
                rd.device_id,
                rollout.model,
                rollout.version,
                f"rollout {rollout.id}: {rollout.reason}",
                datetime.now(UTC),
                ttl_s=max(rollout.device_timeout_s, 3600),
            )
        )


def _rollout_ids(events: list[UpdateEvent]) -> list[int]:
    """The rollouts ``events`` name (``rollout-<id>``)."""
    ids: set[int] = set()
    for e in events:
        if e.rollout_id and e.rollout_id.startswith("rollout-"):
            with contextlib.suppress(ValueError):
                ids.add(int(e.rollout_id.removeprefix("rollout-")))
    return sorted(ids)
