"""The rows ingest writes, on a real SQLite database: the hand-prepared statements and their
fast paths must store exactly what SQLAlchemy's own would."""

from __future__ import annotations

import asyncio
import functools
import gc
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.types import DateTime

from control_plane.app import gc_thresholds
from control_plane.db.bulk import insert_rows, processors, raw_insert, sqlite_datetime
from control_plane.db.models import DeviceSample, TelemetrySample
from control_plane.db.session import make_engine, migrate, session_factory
from control_plane.ingest.ingestor import Ingestor
from control_plane.ingest.rows import (
    DEVICE_SAMPLE_COLUMNS,
    PREPARED,
    SAMPLE_COLUMNS,
    STORED_SAMPLE_COLUMNS,
    telemetry_time,
    unstorable_rows,
)
from control_plane.metrics import FleetMetrics
from control_plane.settings import ControlPlaneSettings

TIMES = [
    datetime(2026, 12, 3, 7, 8, 9, 123456),
    datetime(2026, 12, 3, 7, 8, 9, tzinfo=UTC),
    datetime(999, 1, 2, 3, 4, 5, 6),
    datetime(2026, 12, 3, 7, 8, 9, 1, tzinfo=timezone(timedelta(hours=2))),
]
PG = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("at", TIMES, ids=str)
def test_sqlite_times_are_written_as_sqlalchemy_writes_them(at: datetime) -> None:
    dialect = sqlite.dialect()
    general = DateTime().dialect_impl(dialect).bind_processor(dialect)
    assert general is not None
    assert sqlite_datetime(general, at) == general(at)


def test_a_value_of_the_wrong_type_is_refused_with_a_reason_not_an_exception() -> None:
    row = ("dev-1", 1, datetime.now(UTC), 1.0, "mlp", "two", 1, 0, 1, 1, None, None, None, 0)
    why = unstorable_rows(TelemetrySample.__table__, SAMPLE_COLUMNS, [row])
    assert why is not None and "wrong type" in why


def telemetry(seq: int, at: str, requests: int) -> bytes:
    model = {"model": "mlp", "version": 2, "requests": requests, "errors": 1, "rows": requests}
    return json.dumps(
        {
            "schema_version": 1,
            "device_id": "dev-1",
            "seq": seq,
            "time": at,
            "window_s": 10.0,
            "models": [model | {"batches": 1, "p99_ms": 3.5}],
            "device": {"cpu_percent": 12.5},
        }
    ).encode()


def test_telemetry_rows_are_stored_in_utc_once_and_counted(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cp.db'}"
    migrate(url)
    metrics = FleetMetrics()
    received = [datetime.min, datetime.max]  # around the first batch's write

    async def run() -> tuple[list[DeviceSample], list[TelemetrySample], str]:
        engine = make_engine(url)
        sessions = session_factory(engine)
        ingest = Ingestor(sessions, metrics, batch_size=100, max_delay_s=0.01)
        ingest.telemetry("dev-1", telemetry(1, "2026-12-03T09:00:00.250000+02:00", 10))
        ingest.telemetry("dev-1", telemetry(2, "2026-12-03T07:00:10Z", 20))
        received[0] = datetime.now(UTC)
        await ingest.drain()
        received[1] = datetime.now(UTC)
        exported = metrics.render().decode()
        # a redelivery: stored once
        ingest.telemetry("dev-1", telemetry(1, "2026-12-03T09:00:00.250000+02:00", 10))
        await ingest.drain()
        async with sessions() as s:
            devices = list((await s.scalars(select(DeviceSample).order_by("seq"))).all())
            samples = list((await s.scalars(select(TelemetrySample).order_by("seq"))).all())
        await engine.dispose()
        return devices, samples, exported

    devices, samples, exported = asyncio.run(run())
    first = datetime(2026, 12, 3, 7, 0, 0, 250000, tzinfo=UTC)
    assert [(d.seq, d.time.replace(tzinfo=UTC), d.cpu_percent) for d in devices] == [
        (1, first, 12.5),
        (2, first + timedelta(seconds=9.75), 12.5),
    ]
    assert [(s.seq, s.model, s.version, s.requests, s.p99_ms) for s in samples] == [
        (1, "mlp", 2, 10, 3.5),
        (2, "mlp", 2, 20, 3.5),
    ]
    assert samples[0].time.replace(tzinfo=UTC) == first
    # when the control plane wrote them, by its clock, not the devices': the redelivery,
    # refused, left the first one's
    for sample in samples:
        assert received[0] <= sample.received_at.replace(tzinfo=UTC) <= received[1]
    assert 'edgefleet_fleet_requests_total{model="mlp",version="2"} 30.0' in exported
    assert 'edgefleet_fleet_errors_total{model="mlp",version="2"} 2.0' in exported


@pytest.mark.parametrize("dialect", [sqlite.dialect(), PG], ids=lambda d: d.name)
def test_telemetry_rows_go_to_the_driver_as_they_are(dialect: Dialect) -> None:
    """Built once per message with the time in the driver's form, a batch's rows need no
    processing: params hands the list itself over (no copy per row)."""
    form = telemetry_time(dialect)
    assert form is not None
    when = datetime(2026, 12, 3, 7, 8, 9, 123456, tzinfo=UTC)
    at = form(when)
    general = processors(dialect, DeviceSample.__table__, ("time",))[0]
    assert at == (general(when) if general else when)  # what SQLAlchemy's processor writes
    for table, names, row in (
        (DeviceSample.__table__, DEVICE_SAMPLE_COLUMNS, ("d", 1, at, 1.5, 10, None, 0)),
        (
            TelemetrySample.__table__,
            STORED_SAMPLE_COLUMNS,
            ("d", 1, at, 10.0, "mlp", 2, 5, 0, 5, 1, 1.0, None, 3.5, 0, at),
        ),
    ):
        raw = raw_insert(dialect, table, names)
        assert raw is not None
        rows = [row]
        assert raw.params(rows, prepared=PREPARED) is rows


def event(seq: int) -> bytes:
    return json.dumps(
        {
            "schema_version": 1,
            "device_id": "dev-1",
            "event_id": f"e-{seq}",
            "time": "2026-12-03T07:00:10Z",
            "model": "mlp",
            "version": 2,
            "state": "received",
        }
    ).encode()


def test_telemetry_waits_for_company_but_an_event_is_written_promptly(tmp_path: Path) -> None:
    """A batch of telemetry alone waits up to its longer delay (longer batches dirty fewer
    index pages per row); an event arriving cuts it to the events' short one."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'cp.db'}"
    migrate(url)

    async def run() -> tuple[int, int, float]:
        engine = make_engine(url)
        ingest = Ingestor(
            session_factory(engine),
            FleetMetrics(),
            batch_size=100,
            max_delay_s=0.05,
            telemetry_delay_s=30.0,
        )
        writer = asyncio.create_task(ingest.run())
        ingest.telemetry("dev-1", telemetry(1, "2026-12-03T07:00:00Z", 10))
        while ingest.queued:  # the writer has taken it into a batch
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the events' delay, twice: a batch cut at it is written
        waiting = ingest.stored  # 0: the telemetry waits for more
        started = asyncio.get_running_loop().time()
        ingest.event("dev-1", event(1))
        while ingest.stored < 2:
            await asyncio.sleep(0.01)
        took = asyncio.get_running_loop().time() - started
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        await engine.dispose()
        return waiting, ingest.stored, took

    waiting, stored, took = asyncio.run(run())
    assert waiting == 0
    assert stored == 2
    assert took < 15  # written with the event, not after the telemetry's 30 s


def test_rows_many_to_a_statement_are_stored_as_one_a_statement_would_store_them(
    db_url: str,
) -> None:
    """Several whole statements' worth and a rest, with duplicates in one statement, across two,
    and of a row stored before: each key is stored once, with its first row's values."""
    migrate(db_url)
    table = TelemetrySample.__table__
    base = datetime(2026, 12, 3, 7, 0, tzinfo=UTC)

    def row(i: int, requests: int) -> tuple[object, ...]:
        values = {
            "device_id": f"dev-{i % 7}",
            "seq": i,
            "time": base + timedelta(seconds=i),
            "window_s": 10.0,
            "model": "mlp",
            "version": 2,
            "requests": requests,
            "errors": 0,
            "rows": requests,
            "batches": 1,
            "p50_ms": 1.0,
            "p95_ms": None,
            "p99_ms": 3.5,
            "queue_depth": 0,
            "prompt_tokens": 0,
            "generated_tokens": 0,
            "ttft_p99_ms": None,
            "inter_token_p99_ms": None,
            "cost_per_1k_tokens": None,
            "busy_s": 0.25,
            "received_at": base,
        }
        return tuple(values[column] for column in STORED_SAMPLE_COLUMNS)

    async def run() -> tuple[int, list[tuple[int, int]]]:
        engine = make_engine(db_url)
        sessions = session_factory(engine)
        async with sessions.begin() as s:
            per = raw_insert((await s.connection()).dialect, table, STORED_SAMPLE_COLUMNS)
            assert per is not None
            # one statement's worth exactly (no rest), then several and a rest
            await insert_rows(s, table, STORED_SAMPLE_COLUMNS, [row(0, 5)] * per.per_statement)
        rows = [row(i, 10 + i) for i in range(4 * per.per_statement + 3)]
        rows[1] = row(0, 99)  # stored before
        rows[3] = row(2, 99)  # in the same statement as the first
        rows[-2] = row(4, 99)  # in another statement
        async with sessions.begin() as s:
            await insert_rows(s, table, STORED_SAMPLE_COLUMNS, rows)
        async with sessions() as s:
            stored = (await s.execute(select(table.c.seq, table.c.requests))).all()
        await engine.dispose()
        return per.per_statement, sorted((seq, requests) for seq, requests in stored)

    per, stored = asyncio.run(run())
    assert per < 100
    n = 4 * per + 3
    expected = {0: 5} | {i: 10 + i for i in range(2, n) if i not in (3, n - 2)}
    assert stored == sorted(expected.items())


def test_what_ingest_holds_does_not_wake_the_collector(tmp_path: Path) -> None:
    """Holding the most device messages it can (the broker's in-flight window, received and
    not yet written), ingest makes no collection of the youngest generation run under the
    control plane's thresholds; under the fixed ones it set before, it made several, each
    rescanning the messages held."""
    held = 20_000
    url = f"sqlite+aiosqlite:///{tmp_path / 'cp.db'}"
    settings = ControlPlaneSettings(db_url=url, mqtt_broker_inflight=held)
    payloads = [telemetry(seq, "2026-12-03T07:00:10Z", 1) for seq in range(1, held + 1)]

    def collections(thresholds: tuple[int, int, int]) -> int:
        async def hold() -> int:
            engine = make_engine(url)
            sessions, metrics = session_factory(engine), FleetMetrics()
            ingest = Ingestor(sessions, metrics, batch_size=held, max_delay_s=60, ack_window=held)
            acked: list[tuple[bytes, int]] = []

            def ack(key: bytes, seq: int) -> None:  # as the MQTT connection's, made once
                acked.append((key, seq))

            previous = gc.get_threshold()
            gc.set_threshold(*thresholds)
            try:
                gc.collect()  # counts from zero
                before = sum(g["collections"] for g in gc.get_stats())
                for seq, payload in enumerate(payloads):
                    # an acknowledgement per message, as the MQTT connection gives
                    ingest.telemetry("dev-1", payload, functools.partial(ack, b"id", seq))
                ran = sum(g["collections"] for g in gc.get_stats()) - before
            finally:
                gc.set_threshold(*previous)
            assert ingest.queued == held and not acked
            await engine.dispose()
            return ran

        return asyncio.run(hold())

    assert collections(gc_thresholds(settings)) == 0
    assert collections((50_000, 20, 100)) >= 2
