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
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ValidationError
from sqlalchemy import BigInteger, Float, Integer, String, Table, bindparam, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import DATETIME as SQLITE_DATETIME
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agent.protocol.messages import (
    DeviceStatus,
    DeviceTelemetry,
    ModelTelemetry,
    Telemetry,
    UpdateEvent,
)
from control_plane.db.models import Device, DeviceSample, TelemetrySample, UpdateEventRecord
from control_plane.db.session import database_unavailable
from control_plane.fastdecode import Bounds, FastDecoder, tighten
from control_plane.metrics import FleetMetrics, VersionSums

log = logging.getLogger("edgefleet.control_plane.ingest")

EventListener = Callable[[list[UpdateEvent]], Awaitable[None]]
Ack = Callable[[], None]
"""Acknowledges one device message to the broker."""
RETRY_MIN_S = 0.1
RETRY_MAX_S = 5.0
"""Backoff between writes while the database is unreachable."""
M = TypeVar("M", bound=BaseModel)


async def insert_ignore(
    session: AsyncSession,
    table: Any,
    rows: list[dict[str, Any]],
) -> None:
    """INSERT ... ON CONFLICT DO NOTHING, in the dialect of the session's database, of rows
    that all have the same keys."""
    if rows:
        names = tuple(rows[0])
        await insert_rows(session, table, names, _tuples(names, rows))


async def insert_rows(
    session: AsyncSession,
    table: Any,
    names: tuple[str, ...],
    rows: list[tuple[Any, ...]],
    prepared: frozenset[str] = frozenset(),
) -> None:
    """INSERT ... ON CONFLICT DO NOTHING of rows given as tuples of the columns ``names``.

    They go to the driver's executemany through a statement and bind processors prepared once
    per table: SQLAlchemy's per-row parameter processing cost more than the database's own
    work at thousands of telemetry messages a second. The columns in ``prepared`` already
    hold what the driver takes (:func:`driver_time`): rows whose other columns need no
    processing go to the driver as they are."""
    if not rows:
        return
    conn = await session.connection()
    raw = _raw_insert(conn.dialect, table, names)
    if raw is None:  # a driver whose parameter style we do not write by hand
        if prepared:
            raise ValueError(f"{conn.dialect.name}: prepared values but no hand-made statement")
        dialect = conn.dialect.name
        stmt = (pg_insert if dialect == "postgresql" else sqlite_insert)(table)
        await session.execute(
            stmt.on_conflict_do_nothing(), [dict(zip(names, row, strict=True)) for row in rows]
        )
        return
    await conn.exec_driver_sql(raw.sql, raw.params(rows, prepared))


async def execute_many(
    session: AsyncSession,
    raw: Callable[[Dialect], RawStatement | None],
    fallback: Any,
    rows: list[dict[str, Any]],
) -> None:
    """Run the statement ``raw`` prepares for the session's dialect once per row (``fallback``,
    a Core statement, where it prepares none)."""
    if not rows:
        return
    conn = await session.connection()
    statement = raw(conn.dialect)
    if statement is None:
        await session.execute(fallback, rows)
    else:
        await conn.exec_driver_sql(statement.sql, statement.params(_tuples(statement.names, rows)))


def _tuples(names: tuple[str, ...], rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple([row[n] for n in names]) for row in rows]


@dataclass(frozen=True)
class RawStatement:
    """A statement in the driver's own parameter style, and per parameter the bind processor
    SQLAlchemy would apply (a datetime to SQLite's text form, say)."""

    sql: str
    names: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]

    def params(
        self, rows: list[tuple[Any, ...]], prepared: frozenset[str] = frozenset()
    ) -> list[tuple[Any, ...]]:
        """The rows (tuples in the order of ``names``) with their values processed, but for
        the columns in ``prepared``: with none left to process, the rows themselves."""
        fixes = [
            (i, f)
            for i, (f, n) in enumerate(zip(self.processors, self.names, strict=True))
            if f is not None and n not in prepared
        ]
        if not fixes:
            return rows
        out: list[tuple[Any, ...]] = []
        for row in rows:
            values = list(row)
            for i, f in fixes:
                if (value := values[i]) is not None:
                    values[i] = f(value)
            out.append(tuple(values))
        return out


def _placeholder(dialect: Dialect) -> str | None:
    return {"qmark": "?", "format": "%s", "pyformat": "%s"}.get(dialect.paramstyle)


def _processors(dialect: Dialect, table: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    out = []
    for n in names:
        impl = table.c[n].type.dialect_impl(dialect)
        processor = impl.bind_processor(dialect)
        if isinstance(impl, SQLITE_DATETIME) and impl._storage_format == SQLITE_DATETIME_FORMAT:
            processor = functools.partial(_sqlite_datetime, processor)
        out.append(processor)
    return tuple(out)


SQLITE_DATETIME_FORMAT = (
    "%(year)04d-%(month)02d-%(day)02d %(hour)02d:%(minute)02d:%(second)02d.%(microsecond)06d"
)
"""SQLAlchemy's default storage format for SQLite datetimes, which ``_sqlite_datetime`` writes."""


def _sqlite_datetime(general: Callable[[Any], Any], value: Any) -> Any:
    """SQLAlchemy's text form of a datetime in SQLite (its wall time, microseconds always),
    from its fields: the general processor (a %-format of a dict) was a tenth of the control
    plane's ingest time, and ``isoformat`` of an aware time asks its tzinfo for the offset
    (pydantic's, a call out of C and back: 1.3 us against 0.75 here)."""
    if type(value) is datetime:
        return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031 (the fastest form)
            value.year,
            value.month,
            value.day,
            value.hour,
            value.minute,
            value.second,
            value.microsecond,
        )
    return general(value)


def driver_time(dialect: Dialect) -> Callable[[datetime], Any] | None:
    """What turns a UTC datetime into the value the driver takes for a DateTime column (the
    bind processor SQLAlchemy would apply; the datetime itself where there is none), for
    rows built once per message with it; None where ingest writes through SQLAlchemy."""
    table = DeviceSample.__table__
    if _raw_insert(dialect, table, DEVICE_SAMPLE_COLUMNS) is None:
        return None
    (processor,) = _processors(dialect, table, ("time",))
    return processor or _same


def _same(at: datetime) -> datetime:
    return at


@functools.cache
def _raw_insert(dialect: Dialect, table: Any, names: tuple[str, ...]) -> RawStatement | None:
    mark = _placeholder(dialect)
    if mark is None or dialect.name not in ("sqlite", "postgresql"):
        return None
    quote = dialect.identifier_preparer.quote
    sql = (
        f"INSERT INTO {dialect.identifier_preparer.format_table(table)} "
        f"({', '.join(quote(n) for n in names)}) VALUES ({', '.join([mark] * len(names))}) "
        "ON CONFLICT DO NOTHING"
    )
    return RawStatement(sql, names, _processors(dialect, table, names))


@functools.cache
def _raw_last_seen(dialect: Dialect) -> RawStatement | None:
    mark = _placeholder(dialect)
    if mark is None:
        return None
    table = Device.__table__
    quote = dialect.identifier_preparer.quote
    sql = (
        f"UPDATE {dialect.identifier_preparer.format_table(table)} "
        f"SET {quote('last_seen')} = {mark} WHERE {quote('id')} = {mark}"
    )
    return RawStatement(sql, ("seen", "device"), _processors(dialect, table, ("last_seen", "id")))


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
        self.batch_size = batch_size
        self.max_delay_s = max_delay_s
        self.telemetry_delay_s = max_delay_s if telemetry_delay_s is None else telemetry_delay_s
        self.ack_window = ack_window
        self._queue: asyncio.Queue[tuple[str, Any, Ack | None]] = asyncio.Queue(maxsize=100_000)
        self.listeners: list[EventListener] = []
        self.on_device_online: list[Callable[[str], Awaitable[None]]] = []
        """Called with a device that was offline and said it is online."""
        self.on_births: list[Callable[[list[str]], None]] = []
        """Called with the devices whose birth message (an online status, sent at every
        connect) a batch stored, whether or not they were shown online already."""
        self.stored = 0
        self.on_batch_written: list[Callable[[], None]] = []
        """Called after each batch (the MQTT adapter resumes reading when the queue drained)."""
        self.last_seen_resolution = timedelta(seconds=last_seen_resolution_s)
        self._seen_written: dict[str, datetime] = {}
        engine = sessions.kw.get("bind")
        self._driver_time = driver_time(engine.dialect) if engine is not None else None
        """Telemetry times are put in the driver's form as messages arrive, once each."""
        self._device_checks = _checks(DeviceSample.__table__, DEVICE_SAMPLE_COLUMNS)
        self._sample_checks = _checks(TelemetrySample.__table__, SAMPLE_COLUMNS)
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
        try:
            # the validator itself: model_validate_json is a Python call around it
            message: M = kind.__pydantic_validator__.validate_json(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "message"
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
        return self._queue.qsize()

    def _enqueue(self, leaf: str, device_id: str, item: tuple[str, Any, Ack | None]) -> None:
        """Queue a message for the next batch. The broker sends no more unacknowledged QoS 1
        messages than the connection's Receive Maximum, so only a flood of QoS 0 messages can
        fill the queue: those are refused."""
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.reject(leaf, "overloaded", device_id, "ingest queue full")
            _call(item[2])

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
        message = self._parse("telemetry", Telemetry, device_id, payload) if checked else fast
        if message is None:
            _call(ack)
            return
        at = _utc(message.time)
        form = self._driver_time
        device, samples = telemetry_rows(message, at if form is None else form(at))
        # Checked here, one message at a time: a value the database refuses would otherwise
        # fail the whole batch, and with it other devices' telemetry.
        if checked and (
            why := _checked(self._device_checks, (device,))
            or _checked(self._sample_checks, samples)
        ):
            self.reject("telemetry", "out_of_range", device_id, why)
            _call(ack)
        else:
            self._enqueue("telemetry", device_id, ("telemetry", (device, samples, at), ack))

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
        while True:
            batch = [await self._queue.get()]
            unacked = int(batch[0][2] is not None)
            # Telemetry waits longer for company than what a rollout waits on: a batch that
            # spans more of the fleet's messages costs fewer commits per message; an event or
            # status cuts the wait short.
            started = time.monotonic()
            prompt = started + self.max_delay_s
            deadline = prompt if batch[0][0] != "telemetry" else started + self.telemetry_delay_s
            while len(batch) < self.batch_size:
                # what is queued already is taken as it is: a wait_for (a task) per message
                # cost more than the insert under load
                while len(batch) < self.batch_size and not self._queue.empty():
                    item = self._queue.get_nowait()
                    batch.append(item)
                    unacked += item[2] is not None
                    if item[0] != "telemetry" and deadline > prompt:
                        deadline = max(prompt, time.monotonic() + self.max_delay_s)
                remaining = deadline - time.monotonic()
                if len(batch) >= self.batch_size or remaining <= 0:
                    break
                if unacked >= self.ack_window:
                    break  # queue empty; the broker sends no more until these are acknowledged
                try:
                    async with asyncio.timeout(remaining):
                        item = await self._queue.get()
                except TimeoutError:
                    break
                batch.append(item)
                unacked += item[2] is not None
                if item[0] != "telemetry" and deadline > prompt:
                    deadline = max(prompt, time.monotonic() + self.max_delay_s)
            try:
                # while the database is away the batch waits here, and what follows it waits
                # in the queue and then in the broker: held, not dropped
                await self._retrying("telemetry batch", functools.partial(self._write, batch))
            except Exception:
                # a batch the database refuses (not one it cannot take now) must not stop
                # ingest: count it, log it, keep going
                self.metrics.rejected("ingest", "write_failed")
                log.exception("telemetry batch not stored", extra={"messages": len(batch)})
                _ack_all(batch)
                for callback in self.on_batch_written:
                    callback()
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

    async def drain(self) -> None:
        """Write whatever is queued now (tests and shutdown)."""
        batch = []
        while not self._queue.empty():
            batch.append(self._queue.get_nowait())
        if batch:
            await self._write(batch)
            await self._notify([m for kind, m, _ in batch if kind == "event"])
            _ack_all(batch)

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

    async def _write(self, batch: list[tuple[str, Any, Ack | None]]) -> None:
        samples: list[tuple[Any, ...]] = []
        devices: list[tuple[Any, ...]] = []
        events: list[UpdateEvent] = []
        statuses: list[DeviceStatus] = []
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
            device_row, sample_rows, _at = message
            seen[device_row[DEVICE_ID]] = now
            devices.append(device_row)
            samples.extend(sample_rows)
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
                    _raw_last_seen,
                    update(devices_table)
                    .where(devices_table.c.id == bindparam("device"))
                    .values(last_seen=bindparam("seen")),
                    [{"device": d, "seen": w} for d, w in seen.items()],
                )
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        self.metrics.batch_messages.observe(len(batch))
        self._seen_written |= seen
        self.stored += len(batch)
        self.metrics.ingested(per_version(samples), len(devices), len(events))
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
                select(Device).where(Device.id.in_(ids[start : start + 1000]))
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
        return came_online


def _utc(at: datetime) -> datetime:
    """``at`` in UTC (a device's naive time is taken as UTC), so times compare: SQLite keeps
    a datetime's wall time and drops its offset. A time in UTC already (what agents send) is
    returned as it is: no new object per message."""
    if at.tzinfo is None:
        return at.replace(tzinfo=UTC)
    return at.astimezone(UTC) if at.utcoffset() else at


def _call(ack: Ack | None) -> None:
    if ack is not None:
        ack()


def _ack_all(batch: list[tuple[str, Any, Ack | None]]) -> None:
    for *_, ack in batch:
        _call(ack)


DEVICE_SAMPLE_COLUMNS = (
    "device_id",
    "seq",
    "time",
    "cpu_percent",
    "memory_used_bytes",
    "temperature_c",
    "dropped",
)
SAMPLE_COLUMNS = (
    "device_id",
    "seq",
    "time",
    "window_s",
    "model",
    "version",
    "requests",
    "errors",
    "rows",
    "batches",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "queue_depth",
)
STORED_SAMPLE_COLUMNS = (*SAMPLE_COLUMNS, "received_at")
"""The telemetry rows as written: a message's (SAMPLE_COLUMNS), then when its batch is written."""
DEVICE_ID = DEVICE_SAMPLE_COLUMNS.index("device_id")
PREPARED = frozenset(
    {"time", "received_at"}  # times
    | {"cpu_percent", "temperature_c", "window_s", "p50_ms", "p95_ms", "p99_ms"}  # floats
)
"""Columns of the telemetry rows that hold what the driver takes already: the times (put in its
form by :func:`driver_time`) and the floats (floats, validated as such by the message's model;
SQLite's processor would only call ``float`` on them). With these, no value of a telemetry row
is processed again: the rows go to the driver as they are."""
MODEL, VERSION, REQUESTS, ERRORS, ROWS, P99 = (
    SAMPLE_COLUMNS.index(c) for c in ("model", "version", "requests", "errors", "rows", "p99_ms")
)


def telemetry_rows(t: Telemetry, at: Any) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """The device_telemetry row and the telemetry rows (one per model) of a message, as tuples
    of DEVICE_SAMPLE_COLUMNS and SAMPLE_COLUMNS (ingest builds them for every message), with
    ``at`` for the time: the message's in UTC, or that in the driver's form."""
    d = t.device
    device = (
        t.device_id,
        t.seq,
        at,
        d.cpu_percent,
        d.memory_used_bytes,
        d.temperature_c,
        t.dropped,
    )
    samples = [
        (
            t.device_id,
            t.seq,
            at,
            t.window_s,
            m.model,
            m.version,
            m.requests,
            m.errors,
            m.rows,
            m.batches,
            m.p50_ms,
            m.p95_ms,
            m.p99_ms,
            m.queue_depth,
        )
        for m in t.models
    ]
    return device, samples


def per_version(samples: list[tuple[Any, ...]]) -> dict[tuple[str, int], VersionSums]:
    """Telemetry rows (SAMPLE_COLUMNS) summed per model version, for the fleet's counters."""
    out: dict[tuple[str, int], VersionSums] = {}
    for s in samples:
        key = (s[MODEL], s[VERSION])
        sums = out.get(key)
        if sums is None:
            sums = out[key] = VersionSums()
        sums.requests += s[REQUESTS]
        sums.errors += s[ERRORS]
        sums.rows += s[ROWS]
        if (p99 := s[P99]) is not None and (sums.worst_p99_ms is None or p99 > sums.worst_p99_ms):
            sums.worst_p99_ms = p99
    return out


def event_row(e: UpdateEvent) -> dict[str, Any]:
    return {
        "event_id": e.event_id,
        "device_id": e.device_id,
        "time": _utc(e.time),
        "model": e.model,
        "version": e.version,
        "sequence": e.sequence,
        "rollout_id": e.rollout_id,
        "state": e.state.value,
        "code": e.code,
        "reason": e.reason,
    }


INT_BOUNDS = {Integer: 2**31, BigInteger: 2**63}
COUNTS = frozenset({"requests", "errors", "rows", "batches", "queue_depth", "dropped", "seq"})
"""Columns that only count up: a negative value would also fail the fleet's Prometheus counters."""


@dataclass(frozen=True)
class _Checks:
    """What the columns of a row can refuse, by position in the row: string lengths, integer
    bounds (and which integers only count up), and the floats (SQLite stores NaN and infinity
    as NULL)."""

    lengths: tuple[tuple[int, str, int], ...]
    bounds: tuple[tuple[int, str, int, str, bool], ...]
    floats: tuple[tuple[int, str], ...]


@functools.cache
def _checks(table: Any, names: tuple[str, ...]) -> _Checks:
    """Read once per table and row shape: looking columns up per value cost more than parsing
    the message."""
    lengths, bounds, floats = [], [], []
    for i, name in enumerate(names):
        kind = table.c[name].type
        if isinstance(kind, String) and kind.length is not None:
            lengths.append((i, name, kind.length))
        elif (bound := INT_BOUNDS.get(type(kind))) is not None:
            bounds.append((i, name, bound, type(kind).__name__, name in COUNTS))
        elif isinstance(kind, Float):
            floats.append((i, name))
    return _Checks(tuple(lengths), tuple(bounds), tuple(floats))


TELEMETRY_TABLES: tuple[tuple[type[BaseModel], Any, tuple[str, ...]], ...] = (
    (Telemetry, DeviceSample.__table__, DEVICE_SAMPLE_COLUMNS),
    (DeviceTelemetry, DeviceSample.__table__, DEVICE_SAMPLE_COLUMNS),
    (Telemetry, TelemetrySample.__table__, SAMPLE_COLUMNS),
    (ModelTelemetry, TelemetrySample.__table__, SAMPLE_COLUMNS),
)
"""Which message's fields fill which table's columns, by name (see :func:`telemetry_rows`)."""


def storable_bounds() -> Bounds:
    """What the telemetry tables store, as limits on the fields of a telemetry message, for its
    fast decoder: the checks of :func:`unstorable_rows` (string lengths, integer bounds, counts
    not negative, floats finite), so a message within them needs none."""
    out: dict[type[BaseModel], dict[str, dict[str, Any]]] = {}
    for model, table, columns in TELEMETRY_TABLES:
        checks = _checks(table, columns)
        limits: list[tuple[str, str, Any]] = [
            ("max_length", n, size) for _, n, size in checks.lengths
        ]
        for _, name, bound, _, count in checks.bounds:
            # (msgspec takes no bound past an int64: le, not lt)
            limits += [("ge", name, 0 if count else -bound), ("le", name, bound - 1)]
        for _, name in checks.floats:
            limits += [("ge", name, -sys.float_info.max), ("le", name, sys.float_info.max)]
        for key, name, value in limits:
            if name in model.model_fields:
                tighten(out.setdefault(model, {}).setdefault(name, {}), key, value)
    return out


def unstorable(table: Any, rows: list[dict[str, Any]]) -> str | None:
    """Why one of these rows cannot be stored (an integer beyond its column, a negative count, a
    string longer than its column, a NaN or infinity where SQLite stores NULL), else None."""
    for row in rows:
        names = tuple(row)
        if why := unstorable_rows(table, names, [tuple(row.values())]):
            return why
    return None


def unstorable_rows(table: Any, names: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str | None:
    """:func:`unstorable` for rows given as tuples of the columns ``names``: the checks are by
    position, prepared once per row shape (ingest keeps its own, see ``Ingestor.telemetry``)."""
    return _checked(_checks(table, names), rows)


def _checked(checks: _Checks, rows: Sequence[tuple[Any, ...]]) -> str | None:
    try:
        return _unstorable(checks, rows)
    except TypeError as exc:  # a value of another type than its column's
        return f"a value of the wrong type: {exc}"


def _unstorable(checks: _Checks, rows: Sequence[tuple[Any, ...]]) -> str | None:
    for row in rows:
        for i, name, length in checks.lengths:
            if (text := row[i]) is not None and len(text) > length:
                return f"{name}: {len(text)} characters, at most {length}"
        for i, name, bound, type_name, count in checks.bounds:
            if (number := row[i]) is None:
                continue
            if not -bound <= number < bound:
                return f"{name}: {number} does not fit a {type_name} column"
            if count and number < 0:
                return f"{name}: {number} is negative"
        for i, name in checks.floats:
            if (number := row[i]) is not None and not math.isfinite(number):
                return f"{name}: {number} is not a finite number"
    return None
