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
timeouts, bake times). One lock serialises every transition.

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
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import selectinload

from agent.protocol.messages import UpdateEvent
from control_plane.bus import FleetBus
from control_plane.db.models import Device, Model, Rollout, RolloutDevice, TelemetrySample
from control_plane.db.session import stored_utc
from control_plane.errors import Busy, Conflict, Invalid, NotFound
from control_plane.keys import KeyRing
from control_plane.manifests import build_manifest
from control_plane.metrics import FleetMetrics
from control_plane.registry import get_version

log = logging.getLogger("edgefleet.control_plane.rollouts")

ACTIVE = ("running", "paused", "rolling_back")
FINAL_EVENTS = frozenset({"committed", "rejected", "rolled_back"})


def _moves_rollout(event: UpdateEvent) -> bool:
    """A final state, or a fault the device reports while it retries (shown on the rollout);
    plain progress (received, downloading, ...) moves nothing."""
    return event.state.value in FINAL_EVENTS or bool(event.code)


DEVICE_DONE = ("committed", "rejected", "rolled_back", "timed_out")
NEVER_REPORTED = "never reported the new version"
"""Reason of a device given up on while rolling back: a commit it reports later reopens it."""
BASELINE = timedelta(minutes=10)
REASON_LIMIT = 1024
"""Characters of a device's reason kept (a self-test's report can run to kilobytes)."""
CHUNK = 1000
"""Device ids per ``IN`` list: one bound parameter each, and PostgreSQL takes 65,535."""


MAX_DURATION_S = 366 * 86400.0
"""Longest bake time or device timeout a rollout takes (a year): past it a date overflows."""


class Gates(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    max_p99_ratio: float = Field(default=2.0, gt=0, le=1e6)
    min_requests: int = Field(default=20, ge=0)
    """Below this many requests over a bake window, error rate and latency are not judged."""
    self_test: bool = True
    """Fail when any device's self-test fails."""
    max_rejections: int = Field(default=0, ge=0)
    """Devices that refused or rolled back the update locally before the rollout fails."""


class RolloutSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str
    version: int = Field(ge=1, le=2**31 - 1)
    selector: dict[str, str] = Field(default_factory=dict)
    """Label selector: every label given must match (operator labels win over reported)."""
    profiles: list[str] = Field(default_factory=list)
    waves: list[str] = Field(default_factory=lambda: ["1", "10%", "50%", "100%"])
    bake_time_s: float = Field(default=60.0, ge=0, le=MAX_DURATION_S)
    device_timeout_s: float = Field(default=600.0, gt=0, le=MAX_DURATION_S)
    gates: Gates = Field(default_factory=Gates)

    @field_validator("waves", mode="before")
    @classmethod
    def _as_strings(cls, value: Any) -> Any:
        return [str(v) for v in value] if isinstance(value, list) else value

    @field_validator("waves")
    @classmethod
    def _wave_sizes(cls, waves: list[str]) -> list[str]:
        if not waves:
            raise ValueError("at least one wave")
        for w in waves:
            number = w[:-1] if w.endswith("%") else w
            try:
                value = float(number)
            except ValueError:
                raise ValueError(f"wave {w!r} is not a device count or a percentage") from None
            if not math.isfinite(value) or value <= 0 or (w.endswith("%") and value > 100):
                raise ValueError(f"wave {w!r} is out of range")
            if not w.endswith("%") and not value.is_integer():
                raise ValueError(f"wave {w!r} is not a whole number of devices")
        return waves


def wave_bounds(waves: Sequence[str], total: int) -> list[int]:
    """Cumulative device counts per wave, never decreasing, the last covering its share."""
    bounds, prev = [], 0
    for w in waves:
        n = math.ceil(total * float(w[:-1]) / 100) if w.endswith("%") else int(float(w))
        n = max(prev, min(total, n))
        bounds.append(n)
        prev = n
    return bounds


def _utc(when: datetime | None) -> datetime:
    """A stored timestamp that must be set, as an aware UTC datetime."""
    if when is None:
        raise ValueError("timestamp is not set")
    return stored_utc(when)


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
    ) -> None:
        self.sessions = sessions
        self.bus = bus
        self.keys = keys
        self.metrics = metrics
        self.manifest_ttl_s = manifest_ttl_s
        self.artifact_base_url = artifact_base_url
        self.tick_s = tick_s
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

    # -- operator actions -------------------------------------------------------------------

    async def create(self, spec: RolloutSpec, user: str) -> int:
        async with self._lock, self.sessions.begin() as session:
            mv = await get_version(session, spec.model, spec.version)
            report = mv.validation
            if report is None:
                raise Conflict(
                    f"{spec.model} v{spec.version} has not been validated; validate it first"
                )
            if not report.get("passed"):
                raise Conflict(
                    f"{spec.model} v{spec.version} failed validation; it cannot be rolled out"
                )
            targets = await self._targets(session, spec)
            if not targets:
                raise Invalid("selector: no device matches the selector and profiles")
            await self._refuse_overlap(session, spec.model, [d.id for d in targets])
            model = (
                await session.execute(
                    select(Model).where(Model.name == spec.model).with_for_update()
                )
            ).scalar_one()
            sequence = model.next_sequence
            model.next_sequence += 1
            now = datetime.now(UTC)
            rollout = Rollout(
                model=spec.model,
                version=spec.version,
                sequence=sequence,
                manifest={},
                selector=spec.selector,
                profiles=spec.profiles,
                waves=spec.waves,
                bake_time_s=spec.bake_time_s,
                device_timeout_s=spec.device_timeout_s,
                gates=spec.gates.model_dump(),
                state="running",
                current_wave=0,
                reason="",
                gate_report={},
                created_by=user,
                created_at=now,
                updated_at=now,
            )
            session.add(rollout)
            await session.flush()
            # The manifest without its target, stored once; each device gets it signed for
            # itself alone when its wave starts (see _send). One manifest naming every target
            # would make every device's desired state grow with the fleet: N devices x N ids.
            rollout.manifest = build_manifest(
                mv,
                sequence=sequence,
                base_url=self.artifact_base_url,
                target={},
                rollout_id=f"rollout-{rollout.id}",
                ttl_s=self.manifest_ttl_s,
            )
            bounds = wave_bounds(spec.waves, len(targets))
            for position, device in enumerate(
                targets[: bounds[-1]]
            ):  # beyond the last wave: untouched
                wave = next(i for i, b in enumerate(bounds) if position < b)
                served = {m["model"]: m["version"] for m in device.models}
                session.add(
                    RolloutDevice(
                        rollout_id=rollout.id,
                        device_id=device.id,
                        position=position,
                        wave=wave,
                        state="pending",
                        previous_version=served.get(spec.model),
                        previous_desired=device.desired.get(spec.model),
                        reason="",
                    )
                )
            rollout_id = rollout.id
        await self.step(rollout_id)
        return rollout_id

    async def _refuse_overlap(
        self, session: AsyncSession, model: str, device_ids: list[str]
    ) -> None:
        """Two active rollouts of one model on one device would overwrite each other's desired
        state (the older one's rollback would restore what the newer replaced) and share its
        answers to rollback commands, which name the model, not the rollout."""
        query = select(Rollout.id).where(Rollout.model == model, Rollout.state.in_(ACTIVE))
        active = (await session.execute(query)).scalars().all()
        if not active:
            return
        for start in range(0, len(device_ids), CHUNK):
            clash = (
                await session.execute(
                    select(RolloutDevice.rollout_id, RolloutDevice.device_id)
                    .where(
                        RolloutDevice.rollout_id.in_(active),
                        RolloutDevice.device_id.in_(device_ids[start : start + CHUNK]),
                    )
                    .limit(1)
                )
            ).first()
            if clash is not None:
                raise Busy(
                    f"rollout {clash[0]} of {model} is still active on {clash[1]} (and maybe "
                    "others of these devices): let it finish, cancel or abort it first"
                )

    async def _targets(self, session: AsyncSession, spec: RolloutSpec) -> list[Device]:
        devices = (await session.execute(select(Device).order_by(Device.id))).scalars().all()
        return [
            d
            for d in devices
            if all(d.labels.get(k) == v for k, v in spec.selector.items())
            and (not spec.profiles or d.hardware_profile in spec.profiles)
        ]

    async def pause(self, rollout_id: int) -> None:
        await self._transition(rollout_id, {"running"}, "paused")

    async def resume(self, rollout_id: int) -> None:
        await self._transition(rollout_id, {"paused"}, "running")
        await self.step(rollout_id)

    async def cancel(self, rollout_id: int, user: str) -> None:
        await self._transition(
            rollout_id, {"running", "paused"}, "cancelled", f"cancelled by {user}"
        )

    async def abort(self, rollout_id: int, user: str) -> None:
        await self._transition(
            rollout_id, {"running", "paused"}, "rolling_back", f"aborted by {user}"
        )
        await self.step(rollout_id)

    async def _transition(
        self, rollout_id: int, allowed: set[str], to: str, reason: str = ""
    ) -> None:
        async with self._lock, self.sessions.begin() as session:
            rollout = await session.get(Rollout, rollout_id)
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
                        RolloutDevice.state == "reverting",
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
            await self._step_logged(rollout_id)
        await self._count_states()

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
        events = [e for e in events if _moves_rollout(e)]
        if not events:
            return
        touched: set[int] = set()
        async with self._lock, self.sessions.begin() as session:
            prefetched = await self._rows_for(session, events)
            reverting = await self._reverting_for(session, events)
            for event in events:
                rollout_id = await self._apply_event(session, event, prefetched, reverting)
                if rollout_id is not None:
                    touched.add(rollout_id)
        # The rollout loop steps them, once for all the events that arrive meanwhile: a step
        # reads the whole rollout, and one per ingest batch held ingest up behind it.
        if touched:
            self._dirty |= touched
            self._wake.set()

    async def _rows_for(
        self, session: AsyncSession, events: list[UpdateEvent]
    ) -> dict[tuple[int, str], RolloutDevice]:
        """The rollout rows a batch of events can move, in one query per rollout rather than
        one per event (a rollout to thousands of devices reports thousands of events)."""
        wanted: dict[int, set[str]] = {}
        for e in events:
            if not _moves_rollout(e):
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
        self, session: AsyncSession, events: list[UpdateEvent]
    ) -> dict[tuple[str, str], list[RolloutDevice]]:
        """Rows waiting for the devices' answers to rollback commands, by (device, model)."""
        ids = {
            e.device_id
            for e in events
            if e.state.value in ("rolled_back", "rejected")
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
                    RolloutDevice.state == "reverting",
                )
            )
            for rd, model in result:
                out.setdefault((rd.device_id, model), []).append(rd)
        return out

    async def _apply_event(
        self,
        session: AsyncSession,
        event: UpdateEvent,
        prefetched: dict[tuple[int, str], RolloutDevice],
        reverting: dict[tuple[str, str], list[RolloutDevice]],
    ) -> int | None:
        state, now = event.state.value, datetime.now(UTC)
        if event.rollout_id and event.rollout_id.startswith("rollout-"):
            try:
                rollout_id = int(event.rollout_id.removeprefix("rollout-"))
            except ValueError:
                return None
            rd = prefetched.get((rollout_id, event.device_id))
            reason = _device_reason(event) if event.code else ""
            if rd is not None and reason and rd.state in ("pending", "sent"):
                # a fault the device retries on its own (disk full, a download cut short):
                # shown on the rollout while the device is at it, without moving its state
                rd.reason, rd.updated_at = reason, now
            if rd is None or state not in ("committed", "rejected", "rolled_back"):
                return None
            late = rd.state == "reverted" and rd.reason == NEVER_REPORTED
            if rd.state == "reverting_pending" or late:
                if state == "committed":  # it got there after all: now it gets the command
                    rd.state, rd.sent_at, rd.reason = (
                        "reverting",
                        None,
                        "committed after the rollback started",
                    )
                    rollout = await session.get(Rollout, rollout_id)
                    if rollout is not None and rollout.state == "rolled_back":
                        rollout.state = "rolling_back"
                elif not late:
                    rd.state, rd.reason = "reverted", f"never switched ({reason})"
            elif rd.state == "committed":
                pass  # a device does not un-commit: a later refusal of it is a repeat
            elif rd.state in ("pending", "sent", "timed_out"):
                rd.state, rd.reason = state, reason
            rd.updated_at = now
            return rollout_id
        if state in ("rolled_back", "rejected") and event.code in (
            "fleet_command",
            "nothing_to_roll_back",
        ):
            rows = [
                rd
                for rd in reverting.get((event.device_id, event.model), [])
                if rd.state == "reverting"
            ]
            for rd in rows:
                rd.state, rd.reason, rd.updated_at = "reverted", _device_reason(event), now
            return rows[0].rollout_id if rows else None
        return None

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
            for publish in self._held:
                publish()
        finally:
            self._held = []

    async def step(self, rollout_id: int) -> None:
        async with self._lock, self._transaction() as session:
            rollout = (
                await session.execute(
                    select(Rollout)
                    .where(Rollout.id == rollout_id)
                    .options(selectinload(Rollout.devices))
                )
            ).scalar_one_or_none()
            if rollout is None or rollout.state not in ACTIVE:
                return
            now = datetime.now(UTC)
            await self._reconcile(session, rollout, now)
            if rollout.state == "running":
                await self._run_waves(session, rollout, now)
            if rollout.state == "rolling_back":
                await self._roll_back(session, rollout, now)
            rollout.updated_at = now

    async def _reconcile(self, session: AsyncSession, rollout: Rollout, now: datetime) -> None:
        """Read device states from what devices last said they serve (their retained status),
        so an event lost while the control plane was down cannot leave a device hanging."""
        waiting = [d for d in rollout.devices if d.state in ("sent", "reverting")]
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
        for rd in waiting:
            models = reported.get(rd.device_id)
            if models is None:
                continue
            served = {(m["model"], m["version"]): m.get("sequence") for m in models}
            if (
                rd.state == "sent"
                and served.get((rollout.model, rollout.version)) == rollout.sequence
            ):
                rd.state, rd.reason, rd.updated_at = "committed", "seen in the device's status", now
            elif (
                rd.state == "reverting"
                and (rollout.model, rollout.version) not in served
                and (rd.previous_version is None or (rollout.model, rd.previous_version) in served)
            ):
                rd.state, rd.reason, rd.updated_at = "reverted", "seen in the device's status", now

    # -- running ----------------------------------------------------------------------------

    async def _run_waves(self, session: AsyncSession, rollout: Rollout, now: datetime) -> None:
        gates = Gates.model_validate(rollout.gates)
        wave_devices = [d for d in rollout.devices if d.wave == rollout.current_wave]
        if rollout.wave_started_at is None:
            loaded = await _load_devices(session, [rd.device_id for rd in wave_devices])
            for rd in wave_devices:
                await self._send(session, rollout, rd, now)
            del loaded
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
                rd.state == "sent"
                and _utc(rd.sent_at) + timedelta(seconds=rollout.device_timeout_s) < now
            ):
                rd.state, rd.reason, rd.updated_at = (
                    "timed_out",
                    "no answer within device_timeout_s",
                    now,
                )
        touched = [d for d in rollout.devices if d.wave <= rollout.current_wave]
        failed = [d for d in touched if d.state in ("rejected", "rolled_back")]
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
        if any(d.state not in DEVICE_DONE for d in wave_devices):
            return None
        if wave_devices and not any(d.state == "committed" for d in wave_devices):
            # No evidence the version works anywhere (every device timed out, or refused within
            # max_rejections): going on would roll it out wider blind. A dead artifact URL or a
            # broker that refuses the devices' topics looks exactly like this.
            timed_out = sum(d.state == "timed_out" for d in wave_devices)
            return self._fail(
                rollout,
                f"no device of wave {rollout.current_wave + 1} committed the update "
                f"({timed_out} timed out, {len(wave_devices) - timed_out} refused it)",
            )
        if rollout.bake_started_at is None:
            rollout.bake_started_at = now
        verdict, report = await self._telemetry_gates(session, rollout, gates, touched, now)
        rollout.gate_report = {**rollout.gate_report, str(rollout.current_wave): report}
        if verdict:
            return self._fail(rollout, verdict)
        if _utc(rollout.bake_started_at) + timedelta(seconds=rollout.bake_time_s) > now:
            return None  # still baking
        if rollout.current_wave + 1 >= len(rollout.waves) or not [
            d for d in rollout.devices if d.wave > rollout.current_wave
        ]:
            rollout.state, rollout.reason = (
                "succeeded",
                f"all {len(rollout.waves)} waves passed their gates",
            )
            log.info("rollout succeeded", extra={"rollout": rollout.id})
            return None
        rollout.current_wave += 1
        rollout.wave_started_at = rollout.bake_started_at = None
        await self._run_waves(session, rollout, now)
        return None

    def _fail(self, rollout: Rollout, reason: str) -> None:
        rollout.state, rollout.reason = "rolling_back", reason
        log.warning(
            "rollout gate failed: rolling back", extra={"rollout": rollout.id, "reason": reason}
        )

    async def _telemetry_gates(
        self,
        session: AsyncSession,
        rollout: Rollout,
        gates: Gates,
        touched: list[RolloutDevice],
        now: datetime,
    ) -> tuple[str | None, dict[str, Any]]:
        ids = [d.device_id for d in touched if d.state == "committed"]
        # every window of the new version on touched devices counts: it only runs there since
        # they switched, whatever the bake window says. Windows are chosen by when the control
        # plane received them, not by their time: a device's clock behind by more than the
        # rollout's age dates them before it, one ahead dates them past now (or an earlier,
        # rolled-back rollout's inside it), and the gates would judge the wrong windows.
        since = _utc(rollout.created_at)
        new = await _window(session, rollout.model, rollout.version, ids, since, now)
        report: dict[str, Any] = {
            "requests": new["requests"],
            "errors": new["errors"],
            "p99_ms": new["p99_ms"],
        }
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
        previous = {d.previous_version for d in touched if d.previous_version is not None}
        if previous and new["p99_ms"]:
            # the previous version's windows received in the BASELINE before the rollout
            created = _utc(rollout.created_at)
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

    async def _send(
        self, session: AsyncSession, rollout: Rollout, rd: RolloutDevice, now: datetime
    ) -> None:
        device = await session.get(Device, rd.device_id)
        if device is None:
            rd.state, rd.reason = "timed_out", "device no longer in the inventory"
            return
        # dated now, not at the rollout's creation: a wave started or resumed weeks later
        # must not send a manifest past its expiry
        dated = {
            "issued_at": now.isoformat(),
            "expires_at": (now + timedelta(seconds=self.manifest_ttl_s)).isoformat(),
        }
        signed = self.keys.sign(
            {**rollout.manifest, **dated, "target": {"device_ids": [device.id]}}
        )
        device.desired = {**device.desired, rollout.model: signed}
        rd.state, rd.sent_at, rd.updated_at = "sent", now, now
        self._publish_desired(device)

    def _publish_desired(self, device: Device) -> None:
        """Publish ``device``'s desired state once the step's transaction commits."""
        self._held.append(
            functools.partial(self.bus.publish_desired, device.id, list(device.desired.values()))
        )

    # -- rolling back -----------------------------------------------------------------------

    async def _roll_back(self, session: AsyncSession, rollout: Rollout, now: datetime) -> None:
        timeout = timedelta(seconds=rollout.device_timeout_s)
        touched = ("sent", "committed", "timed_out")
        restore = [rd.device_id for rd in rollout.devices if rd.state in touched]
        resend = self._resend.pop(rollout.id, set())
        self._rolling_back.add(rollout.id)
        loaded = await _load_devices(session, restore)  # noqa: F841 (kept while used)
        for rd in rollout.devices:
            if rd.state == "pending":
                rd.state, rd.reason = "skipped", "not reached before the rollback"
            elif rd.state in touched:
                await self._restore_desired(session, rollout, rd)
                # still applying, or silent (offline: its retained desired state still held the
                # new version until now): the command follows if it reports a commit
                if rd.state in ("sent", "timed_out"):
                    rd.state, rd.reason = "reverting_pending", "desired state restored"
                else:
                    rd.state, rd.sent_at = "reverting", None
                rd.updated_at = now
            if rd.state == "reverting" and (rd.sent_at is None or rd.device_id in resend):
                command = self._command(rollout, rd)
                self._held.append(
                    functools.partial(self.bus.publish_command, rd.device_id, command)
                )
                if rd.sent_at is None:  # sent again: the timeout counts from the first send
                    rd.sent_at = now
                rd.updated_at = now
            elif rd.state == "reverting" and _utc(rd.sent_at) + timeout < now:
                rd.state, rd.reason = (
                    "revert_timed_out",
                    "no answer to the rollback command in time",
                )
            elif rd.state == "reverting_pending" and _utc(rd.updated_at) + timeout < now:
                # it never reported the new version; its desired state no longer holds it
                rd.state, rd.reason = "reverted", NEVER_REPORTED
        if not [d for d in rollout.devices if d.state in ("reverting", "reverting_pending")]:
            rollout.state = "rolled_back"
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
        now = datetime.now(UTC)
        return self.keys.sign(
            {
                "schema_version": 1,
                "command_id": uuid.uuid4().hex,
                "device_id": rd.device_id,
                "type": "rollback",
                "model": rollout.model,
                "from_version": rollout.version,
                "reason": f"rollout {rollout.id}: {rollout.reason}",
                "issued_at": now.isoformat(),
                "expires_at": (
                    now + timedelta(seconds=max(rollout.device_timeout_s, 3600))
                ).isoformat(),
            }
        )


async def _load_devices(session: AsyncSession, device_ids: list[str]) -> list[Device]:
    """Load these devices into the session in a few queries, so the ``session.get`` per device
    that follows finds them there instead of asking the database once per device. (The
    session's identity map holds objects weakly: keep the list while they are used.)"""
    devices: list[Device] = []
    for start in range(0, len(device_ids), CHUNK):
        chunk = device_ids[start : start + CHUNK]
        devices += (await session.execute(select(Device).where(Device.id.in_(chunk)))).scalars()
    return devices


def _device_reason(event: UpdateEvent) -> str:
    """An event's code and reason, the reason cut to :data:`REASON_LIMIT` characters: it is
    the device's text, and it ends up in the rollout's own reason, the API and a
    ModelRollout's status (whose messages Kubernetes caps)."""
    reason = event.reason or ""
    if len(reason) > REASON_LIMIT:
        reason = reason[:REASON_LIMIT] + "... [truncated]"
    return f"{event.code}: {reason}"


async def _window(
    session: AsyncSession,
    model: str,
    version: int,
    device_ids: list[str],
    since: datetime,
    until: datetime,
) -> dict[str, Any]:
    """Requests, errors and request-weighted p99 of a model version on some devices, over the
    windows the control plane received from ``since`` to ``until`` (its own clock)."""
    if not device_ids:
        return {"requests": 0, "errors": 0, "p99_ms": None}
    t = TelemetrySample
    with_p99 = case((t.p99_ms.is_not(None), t.requests), else_=0)
    requests = errors = 0
    weighted = weight = 0.0
    for start in range(0, len(device_ids), CHUNK):
        row = (
            await session.execute(
                select(
                    func.coalesce(func.sum(t.requests), 0),
                    func.coalesce(func.sum(t.errors), 0),
                    func.coalesce(func.sum(t.p99_ms * with_p99), 0),
                    func.coalesce(func.sum(with_p99), 0),
                ).where(
                    t.model == model,
                    t.version == version,
                    t.device_id.in_(device_ids[start : start + CHUNK]),
                    t.received_at >= since,
                    t.received_at <= until,
                )
            )
        ).one()
        requests, errors = requests + int(row[0]), errors + int(row[1])
        weighted, weight = weighted + float(row[2]), weight + float(row[3])
    return {
        "requests": requests,
        "errors": errors,
        "p99_ms": float(weighted) / weight if weight else None,
    }
