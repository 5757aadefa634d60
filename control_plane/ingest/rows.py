"""What device messages become in the database: the telemetry rows (tuples of known columns,
built once per message) and what the tables can refuse of them, checked before a batch is
written (a value the database refuses would fail the whole batch, other devices' too)."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import BigInteger, Float, Integer, String
from sqlalchemy.engine import Dialect

from common.protocol.messages import (
    DeviceTelemetry,
    GenerativeTelemetry,
    ModelTelemetry,
    Telemetry,
    UpdateEvent,
)
from control_plane.db.bulk import driver_time
from control_plane.db.models import DeviceSample, TelemetrySample
from control_plane.ingest.decode import Bounds, tighten
from control_plane.metrics import VersionSums


def utc(at: datetime) -> datetime:
    """``at`` in UTC (a device's naive time is taken as UTC), so times compare: SQLite keeps
    a datetime's wall time and drops its offset. A time in UTC already (what agents send) is
    returned as it is: no new object per message."""
    if at.tzinfo is UTC:  # what the fast decoder makes of a "Z"
        return at
    if at.tzinfo is None:
        return at.replace(tzinfo=UTC)
    return at.astimezone(UTC) if at.utcoffset() else at


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
    "prompt_tokens",
    "generated_tokens",
    "ttft_p99_ms",
    "inter_token_p99_ms",
    "cost_per_1k_tokens",
    "busy_s",
)
STORED_SAMPLE_COLUMNS = (*SAMPLE_COLUMNS, "received_at")
"""The telemetry rows as written: a message's (SAMPLE_COLUMNS), then when its batch is written."""
DEVICE_ID = DEVICE_SAMPLE_COLUMNS.index("device_id")
SEQ = DEVICE_SAMPLE_COLUMNS.index("seq")
PREPARED = frozenset(
    {"time", "received_at"}  # times
    | {"cpu_percent", "temperature_c", "window_s", "p50_ms", "p95_ms", "p99_ms"}  # floats
    | {"ttft_p99_ms", "inter_token_p99_ms", "cost_per_1k_tokens", "busy_s"}
)
"""Columns of the telemetry rows that hold what the driver takes already: the times (put in its
form by :func:`telemetry_time`) and the floats (floats, validated as such by the message's model;
SQLite's processor would only call ``float`` on them). With these, no value of a telemetry row
is processed again: the rows go to the driver as they are."""
DEVICE, MODEL, VERSION, REQUESTS, ERRORS, ROWS, P99, PROMPT, GENERATED, COST, BUSY = (
    SAMPLE_COLUMNS.index(c)
    for c in (
        "device_id",
        "model",
        "version",
        "requests",
        "errors",
        "rows",
        "p99_ms",
        "prompt_tokens",
        "generated_tokens",
        "cost_per_1k_tokens",
        "busy_s",
    )
)


Row = tuple[Any, ...]


def telemetry_time(dialect: Dialect) -> Callable[[datetime], Any] | None:
    """:func:`~control_plane.db.bulk.driver_time` for the telemetry rows' times."""
    return driver_time(dialect, DeviceSample.__table__, "time")


def telemetry_rows(t: Telemetry, at: Any) -> tuple[Row, ...]:
    """The rows of a telemetry message: its device_telemetry row (DEVICE_SAMPLE_COLUMNS), then
    its telemetry rows (SAMPLE_COLUMNS), one per model, with ``at`` for the time (the message's
    in UTC, or that in the driver's form). Ingest builds them for every message.

    All in one tuple of tuples of plain values: ingest holds each message's rows for up to a
    second, and the fewer containers it holds the less the cyclic collector has to do (it
    stops tracking such a tuple the first time it looks at it)."""
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
    return (
        device,
        *[
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
                *(_NO_TOKENS if m.generative is None else _tokens(m.generative)),
                m.busy_s,
            )
            for m in t.models
        ],
    )


_NO_TOKENS = (0, 0, None, None, None)


def _tokens(
    g: GenerativeTelemetry,
) -> tuple[int, int, float | None, float | None, float | None]:
    return (
        g.prompt_tokens,
        g.generated_tokens,
        g.ttft_p99_ms,
        g.inter_token_p99_ms,
        g.cost_per_1k_tokens,
    )


def per_version(
    samples: Sequence[Row], rate_of: Callable[[str], float | None] | None = None
) -> dict[tuple[str, int], VersionSums]:
    """Telemetry rows (SAMPLE_COLUMNS) summed per model version, for the fleet's counters;
    ``rate_of``: a device's hourly cost rate, to charge its busy time."""
    out: dict[tuple[str, int], VersionSums] = {}
    for s in samples:
        key = (s[MODEL], s[VERSION])
        sums = out.get(key)
        if sums is None:
            sums = out[key] = VersionSums()
        sums.requests += s[REQUESTS]
        sums.errors += s[ERRORS]
        sums.rows += s[ROWS]
        sums.prompt_tokens += s[PROMPT]
        sums.generated_tokens += s[GENERATED]
        if busy := s[BUSY]:
            sums.busy_s += busy
            if rate_of is not None and (rate := rate_of(s[DEVICE])) is not None:
                sums.cost += rate * busy / 3600
        if (cost := s[COST]) is not None:  # weighted by the tokens it was spread over
            sums.cost_weighted += cost * s[GENERATED]
            sums.cost_tokens += s[GENERATED]
        if (p99 := s[P99]) is not None and (sums.worst_p99_ms is None or p99 > sums.worst_p99_ms):
            sums.worst_p99_ms = p99
    return out


def event_row(e: UpdateEvent) -> dict[str, Any]:
    return {
        "event_id": e.event_id,
        "device_id": e.device_id,
        "time": utc(e.time),
        "model": e.model,
        "version": e.version,
        "sequence": e.sequence,
        "rollout_id": e.rollout_id,
        "state": e.state.value,
        "code": e.code,
        "reason": e.reason,
        "progress": e.progress,
        "bytes_done": e.bytes_done,
        "bytes_total": e.bytes_total,
        "window_s": e.window_s,
    }


INT_BOUNDS = {Integer: 2**31, BigInteger: 2**63}
COUNTS = frozenset({"requests", "errors", "rows", "batches", "queue_depth", "dropped", "seq"})
"""Columns that only count up: a negative value would also fail the fleet's Prometheus counters."""


@dataclass(frozen=True)
class Checks:
    """What the columns of a row can refuse, by position in the row: string lengths, integer
    bounds (and which integers only count up), and the floats (SQLite stores NaN and infinity
    as NULL)."""

    lengths: tuple[tuple[int, str, int], ...]
    bounds: tuple[tuple[int, str, int, str, bool], ...]
    floats: tuple[tuple[int, str], ...]


@functools.cache
def column_checks(table: Any, names: tuple[str, ...]) -> Checks:
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
    return Checks(tuple(lengths), tuple(bounds), tuple(floats))


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
        checks = column_checks(table, columns)
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
    return check_rows(column_checks(table, names), rows)


def check_rows(checks: Checks, rows: Sequence[tuple[Any, ...]]) -> str | None:
    try:
        return _unstorable(checks, rows)
    except TypeError as exc:  # a value of another type than its column's
        return f"a value of the wrong type: {exc}"


def _unstorable(checks: Checks, rows: Sequence[tuple[Any, ...]]) -> str | None:
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
