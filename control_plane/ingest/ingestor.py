"""What devices publish, into the database: presence, telemetry, update events.

Telemetry, events and presence (birth and will messages) are queued and written in batches
(one transaction per batch, in arrival order, duplicates ignored by their natural keys), so
ingest keeps up with thousands of devices, and a rollout's thousands of status changes do not
cost a commit each.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ValidationError
from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import defer

from common.protocol.capture import DeviceTelemetry
from common.protocol.diagnostics import DiagnosticUpload
from common.protocol.messages import DeviceStatus, Telemetry, UpdateEvent
from control_plane.db.bulk import execute_many, insert_ignore, insert_rows, raw_last_seen
from control_plane.db.models import (
    CapturedSampleRecord,
    Device,
    DeviceSample,
    TelemetrySample,
    UpdateEventRecord,
)
from control_plane.db.session import database_unavailable
from control_plane.ingest.capture import TELEMETRY_TAGS, CaptureUpload, capture_rows
from control_plane.ingest.decode import FastDecoder
from control_plane.ingest.quality import Extras, carries_quality, quality_rows, store_quality
from control_plane.ingest.rows import (
    DEVICE_ID,
    DEVICE_SAMPLE_COLUMNS,
    PREPARED,
    SAMPLE_COLUMNS,
    SEQ,
    STORED_SAMPLE_COLUMNS,
    Row,
    check_rows,
    column_checks,
    event_row,
    per_version,
    storable_bounds,
    telemetry_rows,
    telemetry_time,
    unstorable,
    utc,
)
from control_plane.metrics import FleetMetrics

log = logging.getLogger("edgefleet.control_plane.ingest")

EventListener = Callable[[list[UpdateEvent]], Awaitable[None]]
Ack = Callable[[], None]
"""Acknowledges one device message to the broker."""
RETRY_MIN_S = 0.1
RETRY_MAX_S = 5.0
"""Backoff between writes while the database is unreachable."""
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
Item = tuple[str, Any, Ack | None]
"""A queued message: its kind ("telemetry", "status", "event"), what is stored of it, its ack."""
HELD_PER_MESSAGE = 10
"""Container objects ingest holds per queued message, with room to spare: seven for a message
about one model (its rows tuple, the device and model rows, the queue entry, the MQTT
acknowledgement and its arguments, one more of the decode's). The control plane's collector
threshold is sized by it (``control_plane.app.gc_thresholds``); a test counts them."""
QUEUE_LIMIT = 100_000
"""Messages queued for the writer at most (see ``Ingestor._enqueue``)."""


class Ingestor:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        metrics: FleetMetrics,
        *,
        batch_size: int,
        max_delay_s: float,
        ack_window: int = 20,
        last_seen_resolution_s: float = 5.0,
        telemetry_delay_s: float | None = None,
    ) -> None:
        """``max_delay_s``: the longest an event or status waits for its batch;
        ``telemetry_delay_s`` (default the same): the longest a batch of telemetry alone waits
        for more.
        ``ack_window``: how many unacknowledged messages the broker sends at once; a batch
        holding that many is written at once (the broker sends no more until it is).
        ``last_seen_resolution_s``: a device's ``last_seen`` is rewritten only once it has
        moved this far (the telemetry rows keep every time): the inventory row is wide, and
        rewriting it for every message cost more than storing the message."""
        self.sessions = sessions
        self.metrics = metrics
        self.rate_of: Callable[[str], float | None] | None = None
        """A device's hourly cost rate, to charge its windows' busy time (the cost counter)."""
        self.batch_size = batch_size
        self.max_delay_s = max_delay_s
        self.telemetry_delay_s = max_delay_s if telemetry_delay_s is None else telemetry_delay_s
        self.ack_window = ack_window
        self._queue: deque[Item] = deque()
        """Messages for the next batch. A deque and a future, not an asyncio.Queue: its put and
        get (an event cleared, waiters looked for, per message) cost a tenth of the rest of a
        message's way from the socket to its batch."""
        self._arrival: asyncio.Future[None] | None = None
        """Set while the writer waits for a message."""
        self.listeners: list[EventListener] = []
        self.on_device_online: list[Callable[[str], Awaitable[None]]] = []
        """Called with a device that was offline and said it is online."""
        self.on_births: list[Callable[[list[str]], None]] = []
        """Called with the devices whose birth message (an online status, sent at every
        connect) a batch stored, whether or not they were shown online already."""
        self.stored = 0
        self.on_telemetry_stored: list[Callable[[list[tuple[str, int]]], None]] = []
        """Called with the (device, seq) of the telemetry a batch stored (or that was stored
        before: a message sent again), and of telemetry refused for good (out of range)."""
        self.on_captures_stored: list[Callable[[list[tuple[str, list[str]]]], None]] = []
        """Called with (device, sample ids) of the captured samples a batch stored (or that
        were stored before, or were refused for good)."""
        self.on_diagnostic: Callable[[str, DiagnosticUpload, Ack | None], None] | None = None
        """Takes a chunk of a device's logs or support bundle (stored apart from the batches:
        :mod:`control_plane.ingest.diagnostics`); None: dropped."""
        self.on_batch_written: list[Callable[[], None]] = []
        """Called after each batch (the MQTT adapter resumes reading when the queue drained)."""
        self.on_sketches: list[Callable[[str, Telemetry], None]] = []
        """Called with each telemetry message queued for storing (the drift monitor keeps
        those that carry input sketches; it must not wait)."""
        self.last_seen_resolution = timedelta(seconds=last_seen_resolution_s)
        self._seen_written: dict[str, datetime] = {}
        engine = sessions.kw.get("bind")
        self._driver_time = telemetry_time(engine.dialect) if engine is not None else None
        """Telemetry times are put in the driver's form as messages arrive, once each."""
        self._device_checks = column_checks(DeviceSample.__table__, DEVICE_SAMPLE_COLUMNS)
        self._sample_checks = column_checks(TelemetrySample.__table__, SAMPLE_COLUMNS)
        self._fast_telemetry = FastDecoder(Telemetry, storable_bounds())

    # -- entry points (called by the MQTT adapter) ----------------------------------------

    def reject(self, topic: str, code: str, device_id: str, reason: str) -> None:
        """Log and count a device message that is not acted on."""
        log.warning(
            "device message rejected",
            extra={"topic": topic, "code": code, "device_id": device_id, "reason": reason},
        )
        self.metrics.rejected(topic, code)

    def _parse(self, leaf: str, kind: type[M], device_id: str, payload: bytes) -> M | None:
        # the validator itself: model_validate_json is a Python call around it
        return self._parse_with(leaf, kind.__pydantic_validator__.validate_json, device_id, payload)

    def _parse_with(
        self, leaf: str, validate: Callable[[bytes], T], device_id: str, payload: bytes
    ) -> T | None:
        try:
            message = validate(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = first["loc"]
            if loc and loc[0] in TELEMETRY_TAGS:  # the union's tag: not a field
                loc = loc[1:]
            where = ".".join(str(p) for p in loc) or "message"
            code = "unsupported_schema" if where == "schema_version" else "malformed"
            self.reject(leaf, code, device_id, f"{where}: {first['msg']}")
            return None
        claimed = getattr(message, "device_id", device_id)
        if claimed != device_id:
            self.reject(leaf, "wrong_device", device_id, f"{leaf} for device {claimed!r}")
            return None
        return message

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _enqueue(self, leaf: str, device_id: str, item: Item) -> None:
        """Queue a message for the next batch. The broker sends no more unacknowledged QoS 1
        messages than the connection's Receive Maximum, so only a flood of QoS 0 messages can
        fill the queue: those are refused."""
        if len(self._queue) >= QUEUE_LIMIT:
            self.reject(leaf, "overloaded", device_id, "ingest queue full")
            _call(item[2])
            return
        self._queue.append(item)
        if (arrival := self._arrival) is not None:
            self._arrival = None
            if not arrival.done():
                arrival.set_result(None)

    async def _arrived(self, timeout_s: float | None = None) -> bool:
        """Wait until a message is queued, for at most ``timeout_s``; whether one is."""
        if self._queue:
            return True
        arrival = self._arrival = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout_s):
                await arrival
        except TimeoutError:
            pass
        finally:
            if self._arrival is arrival:
                self._arrival = None
        return bool(self._queue)

    def _fits(self, leaf: str, device_id: str, table: Any, rows: list[dict[str, Any]]) -> bool:
        why = unstorable(table, rows)
        if why:
            self.reject(leaf, "out_of_range", device_id, why)
        return why is None

    def status(self, device_id: str, payload: bytes, ack: Ack | None = None) -> None:
        """Queue a device's birth or will. ``ack`` (given by the MQTT adapter) acknowledges
        the message to the broker: it is called once the message is stored or refused, so a
        crash before that has the broker deliver it again."""
        status = self._parse("status", DeviceStatus, device_id, payload) if payload else None
        if status is None or (
            status.online
            and not self._fits(
                "status",
                device_id,
                Device.__table__,
                [
                    {
                        "hardware_profile": status.hardware_profile,
                        "agent_version": status.agent_version,
                        "trust_root_version": status.trust_root_version,
                    }
                ],
            )
        ):
            _call(ack)  # an empty payload clears a retained status: nothing to store
            return
        # Written with the next batch, in order with the device's events: one transaction per
        # status would make a rollout to N devices wait for N commits in the receive loop.
        self._enqueue("status", device_id, ("status", status, ack))

    def telemetry(self, device_id: str, payload: bytes, ack: Ack | None = None) -> None:
        fast = self._fast_telemetry.decode(payload)
        # What the fast decoder took is within what the tables store (storable_bounds); the
        # model decides the rest, names why it refuses, and its rows are checked.
        checked = fast is None or fast.device_id != device_id
        message = (
            self._parse_with("telemetry", DeviceTelemetry.validate_json, device_id, payload)
            if checked
            else fast
        )
        if message is None:
            _call(ack)
            return
        if isinstance(message, CaptureUpload):
            self._capture(device_id, message, ack)
            return
        if isinstance(message, DiagnosticUpload):
            if self.on_diagnostic is None:
                _call(ack)
            else:
                self.on_diagnostic(device_id, message, ack)
            return
        at = utc(message.time)
        form = self._driver_time
        rows = telemetry_rows(message, at if form is None else form(at))
        # Checked here, one message at a time: a value the database refuses would otherwise
        # fail the whole batch, and with it other devices' telemetry.
        if checked and (
            why := check_rows(self._device_checks, rows[:1])
            or check_rows(self._sample_checks, rows[1:])
        ):
            self.reject("telemetry", "out_of_range", device_id, why)
            _call(ack)
            self._settled([(device_id, message.seq)])  # never storable: not sent again
        else:
            self._enqueue("telemetry", device_id, ("telemetry", rows, ack))
            for hook in self.on_sketches:
                hook(device_id, message)
            if carries_quality(message):  # a shadow's window, a measured speed: rare
                self._enqueue("quality", device_id, ("quality", quality_rows(message, at), None))

    def _capture(self, device_id: str, upload: CaptureUpload, ack: Ack | None) -> None:
        """Queue an upload's samples; one whose archive is not one is refused (and
        acknowledged to the device all the same: it would be sent again for good)."""
        rows, refused = capture_rows(device_id, upload)
        for sample_id, why in refused:
            self.reject("telemetry", "malformed", device_id, f"sample {sample_id}: {why}")
        ids = [sid for sid, _ in refused]
        if rows:
            self._enqueue("telemetry", device_id, ("capture", (ids, rows), ack))
        else:
            _call(ack)
            self._captures_settled([(device_id, ids)])

    def _captures_settled(self, stored: list[tuple[str, list[str]]]) -> None:
        stored = [(d, ids) for d, ids in stored if ids]
        if stored:
            for callback in self.on_captures_stored:
                callback(stored)

    def event(self, device_id: str, payload: bytes, ack: Ack | None = None) -> None:
        event = self._parse("events", UpdateEvent, device_id, payload)
        if event is not None and self._fits(
            "events", device_id, UpdateEventRecord.__table__, [event_row(event)]
        ):
            self._enqueue("events", device_id, ("event", event, ack))
        else:
            _call(ack)

    # -- the batch writer ------------------------------------------------------------------

    async def run(self) -> None:
        queue = self._queue
        while True:
            while not queue:
                await self._arrived()
            batch = [queue.popleft()]
            unacked = int(batch[0][2] is not None)
            # Telemetry waits longer for company than what a rollout waits on: a batch that
            # spans more of the fleet's messages costs fewer commits per message; an event or
            # status cuts the wait short.
            started = time.monotonic()
            prompt = started + self.max_delay_s
            deadline = prompt if batch[0][0] != "telemetry" else started + self.telemetry_delay_s
            while len(batch) < self.batch_size:
                # what is queued already is taken as it is: a wait (a timer) per message cost
                # more than the insert under load
                while len(batch) < self.batch_size and queue:
                    item = queue.popleft()
                    batch.append(item)
                    unacked += item[2] is not None
                    if item[0] != "telemetry" and deadline > prompt:
                        deadline = max(prompt, time.monotonic() + self.max_delay_s)
                remaining = deadline - time.monotonic()
                if len(batch) >= self.batch_size or remaining <= 0:
                    break
                if unacked >= self.ack_window:
                    break  # queue empty; the broker sends no more until these are acknowledged
                if not await self._arrived(remaining):
                    break
            try:
                # while the database is away the batch waits here, and what follows it waits
                # in the queue and then in the broker: held, not dropped
                await self._retrying("telemetry batch", functools.partial(self._write, batch))
            except Exception:
                # A batch the database refuses (not one it cannot take now) must not stop
                # ingest, nor take the other devices' messages down with the one it refuses:
                # each is written alone, and what is refused alone is counted, logged and
                # settled (its device would send it again for days otherwise).
                log.exception(
                    "batch not stored: its messages are written one by one",
                    extra={"messages": len(batch)},
                )
                written = await self._one_by_one(batch)
                for callback in self.on_batch_written:
                    callback()
                await self._notify([m for kind, m, _ in written if kind == "event"])
                _ack_all(batch)
                self._settled(_stored_telemetry(batch))  # stored, or refused for good
                self._captures_settled(_stored_captures(batch))
                continue
            for callback in self.on_batch_written:
                callback()
            # Acknowledged once the rollouts acted on the batch's events, not just once they
            # are stored: a control plane stopped in between gets them again from the broker
            # (stored once, by key; acted on again, which changes nothing the second time).
            # Nothing replays stored events into rollouts otherwise, and a lost refusal would
            # leave its device to time out.
            await self._notify([m for kind, m, _ in batch if kind == "event"])
            _ack_all(batch)
            self._settled(_stored_telemetry(batch))
            self._captures_settled(_stored_captures(batch))

    async def _one_by_one(self, batch: list[Item]) -> list[Item]:
        """Write each message of ``batch`` alone; those stored."""
        written = []
        for item in batch:
            try:
                await self._retrying("device message", functools.partial(self._write, [item]))
            except Exception as exc:
                self.metrics.rejected("ingest", "write_failed")
                log.warning(
                    "device message not stored: the database refuses it",
                    extra={"kind": item[0], "error": str(exc).strip()[:300]},
                )
                continue
            written.append(item)
        return written

    def _settled(self, stored: list[tuple[str, int]]) -> None:
        if stored:
            for callback in self.on_telemetry_stored:
                callback(stored)

    async def drain(self) -> None:
        """Write whatever is queued now (tests and shutdown)."""
        batch = []
        while self._queue:
            batch.append(self._queue.popleft())
        if batch:
            await self._write(batch)
            await self._notify([m for kind, m, _ in batch if kind == "event"])
            _ack_all(batch)
            self._settled(_stored_telemetry(batch))
            self._captures_settled(_stored_captures(batch))

    async def _retrying(self, what: str, write: Callable[[], Awaitable[None]]) -> None:
        """Run ``write`` until it succeeds while the database is unreachable (a restart, a
        failover); raise any other database error."""
        delay, failures = RETRY_MIN_S, 0
        while True:
            try:
                await write()
            except DBAPIError as exc:
                if not database_unavailable(exc):
                    raise
                failures += 1
                self.metrics.storing_since = None  # device silence is not counted meanwhile
                if failures == 1:
                    log.warning(
                        "database unavailable, holding device messages",
                        extra={"what": what, "error": str(exc.orig).strip()[:300]},
                    )
                await asyncio.sleep(delay)
                delay = min(RETRY_MAX_S, delay * 2)
                continue
            if failures:
                log.info("database back", extra={"what": what, "failed_attempts": failures})
            if self.metrics.storing_since is None:
                self.metrics.storing_since = datetime.now(UTC)
            return

    async def _notify(self, events: list[UpdateEvent]) -> None:
        if not events:
            return
        for listener in self.listeners:
            try:
                await self._retrying("update events", functools.partial(listener, events))
            except Exception:
                log.exception("update events not acted on", extra={"events": len(events)})

    async def _write(self, batch: list[Item]) -> None:
        samples: list[Row] = []
        devices: list[Row] = []
        events: list[UpdateEvent] = []
        statuses: list[DeviceStatus] = []
        quality: list[Extras] = []
        captured: list[dict[str, Any]] = []
        # last_seen and the windows' received_at are the control plane's time, not the
        # message's: presence and the health gates must not depend on the device's clock, and
        # a backlog a device drains was heard now
        now = datetime.now(UTC)
        seen: dict[str, datetime] = {}
        for kind, message, _ in batch:
            if kind == "event":
                events.append(message)
                seen[message.device_id] = now
                continue
            if kind == "status":
                statuses.append(message)
                continue
            if kind == "quality":
                quality.append(message)
                continue
            if kind == "capture":
                captured += message[1]
                continue
            device_row = message[0]  # then its telemetry rows (telemetry_rows)
            seen[device_row[DEVICE_ID]] = now
            devices.append(device_row)
            samples += message[1:]
        # in the driver's form once per batch, like the rows' times once per message
        received = (now if self._driver_time is None else self._driver_time(now),)
        stored = [row + received for row in samples]
        came_online: list[str] = []
        started = time.perf_counter()
        async with self.sessions.begin() as session:
            if statuses:
                came_online = await self._presence(session, statuses, now)
            ready = PREPARED if self._driver_time is not None else frozenset()
            await insert_rows(
                session, DeviceSample.__table__, DEVICE_SAMPLE_COLUMNS, devices, prepared=ready
            )
            await insert_rows(
                session, TelemetrySample.__table__, STORED_SAMPLE_COLUMNS, stored, prepared=ready
            )
            await insert_ignore(
                session, UpdateEventRecord.__table__, [event_row(e) for e in events]
            )
            if quality:
                await store_quality(session, quality, now)
            if captured:
                stamped = [{**row, "received_at": now} for row in captured]
                await insert_ignore(session, CapturedSampleRecord.__table__, stamped)
            seen = {
                d: w
                for d, w in seen.items()
                if (last := self._seen_written.get(d)) is None
                or w - last >= self.last_seen_resolution
            }
            if seen:
                # An executemany, not an ORM bulk UPDATE by primary key: that one fails the
                # whole batch (StaleDataError) when one sender is not in the inventory yet.
                devices_table = cast(Table, Device.__table__)
                await execute_many(
                    session,
                    raw_last_seen,
                    update(devices_table)
                    .where(devices_table.c.id == bindparam("device"))
                    .values(last_seen=bindparam("seen")),
                    [{"device": d, "seen": w} for d, w in seen.items()],
                )
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        self.metrics.batch_messages.observe(len(batch))
        self._seen_written |= seen
        self.stored += len(batch)
        self.metrics.ingested(per_version(samples, self.rate_of), len(devices), len(events))
        self.metrics.heard(seen, now)
        for status in statuses:
            self.metrics.set_online(
                status.device_id, status.online, status.telemetry_interval_s, now
            )
        for device_id in came_online:
            for callback in self.on_device_online:
                await callback(device_id)
        if self.on_births and (born := [s.device_id for s in statuses if s.online]):
            for births in self.on_births:
                births(born)

    @staticmethod
    async def _presence(
        session: AsyncSession, statuses: list[DeviceStatus], now: datetime
    ) -> list[str]:
        """Apply birth and will messages in order; return the devices that came online."""
        ids = sorted({s.device_id for s in statuses})
        known: dict[str, Device] = {}
        for start in range(0, len(ids), 1000):
            rows = await session.execute(
                # not its desired state: a signed manifest per model, kilobytes of JSON to
                # decode for every status a rollout's devices send, and never read here
                select(Device)
                .options(defer(Device.desired))
                .where(Device.id.in_(ids[start : start + 1000]))
            )
            known |= {d.id: d for d in rows.scalars()}
        came_online: list[str] = []
        for status in statuses:
            device = known.get(status.device_id)
            if device is None:
                device = Device(
                    id=status.device_id,
                    operator_labels={},
                    desired={},
                    reported_labels={},
                    models=[],
                    online=False,
                )
                session.add(device)
                known[status.device_id] = device
            if status.online and not device.online:
                came_online.append(status.device_id)
            elif not status.online and status.device_id in came_online:
                came_online.remove(status.device_id)
            device.online = status.online
            device.last_seen = now
            if status.online:  # the last will carries no details: keep what the birth said
                device.hardware_profile = status.hardware_profile
                device.agent_version = status.agent_version
                device.reported_labels = dict(status.labels)
                device.models = [m.model_dump() for m in status.models]
                device.telemetry_interval_s = status.telemetry_interval_s
                device.trust_root_version = status.trust_root_version
                launcher = status.launcher
                device.launcher = launcher.model_dump(mode="json") if launcher else None
                twin = status.twin
                device.twin_reported = twin.model_dump(mode="json") if twin else None
        return came_online


def _call(ack: Ack | None) -> None:
    if ack is not None:
        ack()


def _stored_telemetry(batch: list[Item]) -> list[tuple[str, int]]:
    return [(m[0][DEVICE_ID], m[0][SEQ]) for kind, m, _ in batch if kind == "telemetry"]


def _stored_captures(batch: list[Item]) -> list[tuple[str, list[str]]]:
    """(device, sample ids) of a batch's uploads: those stored and those refused."""
    out = []
    for kind, message, _ in batch:
        if kind == "capture":
            refused, rows = message
            out.append((rows[0]["device_id"], refused + [r["sample_id"] for r in rows]))
    return out


def _ack_all(batch: list[Item]) -> None:
    for _, _, ack in batch:
        if ack is not None:
            ack()
