"""Bulk writes for ingest: statements in the driver's own parameter style, run without
SQLAlchemy's per-row parameter processing, many rows to a statement.

At thousands of telemetry messages a second, SQLAlchemy's per-row work cost more than the
database's own, and so did one statement per row: SQLite steps and resets a statement once per
parameter set, and the driver loops over them in Python. What this module writes stores
exactly what SQLAlchemy's Core statements would (tests/control_plane/test_ingest_rows.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import Any

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import DATETIME as SQLITE_DATETIME
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from control_plane.db.models import Device

STATEMENT_PARAMETERS = 999
"""The most parameters one multi-row INSERT binds: SQLite's limit before 3.32 (it is 32,766
since, PostgreSQL's 65,535). Past about 30 rows a statement the gain is all taken (measured:
2.47 us per row one row a statement, 1.79 at 100 rows, 1.76 at 500, 1.84 at 4,000)."""


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

    They go to the driver through statements and bind processors prepared once per table, many
    rows to a statement (:data:`STATEMENT_PARAMETERS`). The columns in ``prepared`` already
    hold what the driver takes (a time from :func:`driver_time`, say): rows whose other columns
    need no processing go to the driver as they are."""
    if not rows:
        return
    conn = await session.connection()
    raw = raw_insert(conn.dialect, table, names)
    if raw is None:  # a driver whose parameter style we do not write by hand
        if prepared:
            raise ValueError(f"{conn.dialect.name}: prepared values but no hand-made statement")
        dialect = conn.dialect.name
        stmt = (pg_insert if dialect == "postgresql" else sqlite_insert)(table)
        await session.execute(
            stmt.on_conflict_do_nothing(), [dict(zip(names, row, strict=True)) for row in rows]
        )
        return
    await raw.run(conn, raw.params(rows, prepared))


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


@dataclass(frozen=True)
class RawInsert(RawStatement):
    """An INSERT ... ON CONFLICT DO NOTHING (``sql`` inserts one row), which :meth:`run` sends
    many rows to a statement."""

    head: str
    """The statement up to its VALUES lists."""
    row: str
    """One row's VALUES list."""
    tail: str
    """What follows the lists."""

    @property
    def per_statement(self) -> int:
        return max(1, STATEMENT_PARAMETERS // len(self.names))

    def rows_sql(self, n: int) -> str:
        """The statement for ``n`` rows."""
        return _rows_sql(self.head, self.row, self.tail, n)

    async def run(self, conn: AsyncConnection, rows: list[tuple[Any, ...]]) -> None:
        """Insert ``rows`` (processed already): the whole statements' worth in one executemany,
        the rest in one more statement. Rows that conflict with a stored one, or with an
        earlier one of the same statement, are skipped, as one row a statement would be."""
        per = self.per_statement
        full = len(rows) - len(rows) % per
        if full:
            flat = [tuple(chain.from_iterable(rows[i : i + per])) for i in range(0, full, per)]
            await conn.exec_driver_sql(self.rows_sql(per), flat)
        if full < len(rows):
            await conn.exec_driver_sql(
                self.rows_sql(len(rows) - full), tuple(chain.from_iterable(rows[full:]))
            )


@functools.cache
def _rows_sql(head: str, row: str, tail: str, n: int) -> str:
    return f"{head}{', '.join([row] * n)}{tail}"


def _placeholder(dialect: Dialect) -> str | None:
    return {"qmark": "?", "format": "%s", "pyformat": "%s"}.get(dialect.paramstyle)


def processors(dialect: Dialect, table: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    """The bind processor SQLAlchemy applies to each of the columns ``names`` (None where it
    applies none); SQLite's datetimes go through :func:`sqlite_datetime`."""
    out = []
    for n in names:
        impl = table.c[n].type.dialect_impl(dialect)
        processor = impl.bind_processor(dialect)
        if isinstance(impl, SQLITE_DATETIME) and impl._storage_format == SQLITE_DATETIME_FORMAT:
            processor = functools.partial(sqlite_datetime, processor)
        out.append(processor)
    return tuple(out)


SQLITE_DATETIME_FORMAT = (
    "%(year)04d-%(month)02d-%(day)02d %(hour)02d:%(minute)02d:%(second)02d.%(microsecond)06d"
)
"""SQLAlchemy's default storage format for SQLite datetimes, which ``sqlite_datetime`` writes."""


def sqlite_datetime(general: Callable[[Any], Any], value: Any) -> Any:
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


def driver_time(dialect: Dialect, table: Any, column: str) -> Callable[[datetime], Any] | None:
    """What turns a UTC datetime into the value the driver takes for the DateTime ``column`` of
    ``table`` (the bind processor SQLAlchemy would apply; the datetime itself where there is
    none), for rows built once per message with it; None where rows go through SQLAlchemy."""
    if _placeholder(dialect) is None or dialect.name not in RAW_DIALECTS:
        return None
    (processor,) = processors(dialect, table, (column,))
    return processor or _same


def _same(at: datetime) -> datetime:
    return at


RAW_DIALECTS = ("sqlite", "postgresql")
"""The dialects whose statements are written here (others go through SQLAlchemy)."""


@functools.cache
def raw_insert(dialect: Dialect, table: Any, names: tuple[str, ...]) -> RawInsert | None:
    mark = _placeholder(dialect)
    if mark is None or dialect.name not in RAW_DIALECTS:
        return None
    quote = dialect.identifier_preparer.quote
    head = (
        f"INSERT INTO {dialect.identifier_preparer.format_table(table)} "
        f"({', '.join(quote(n) for n in names)}) VALUES "
    )
    row = f"({', '.join([mark] * len(names))})"
    tail = " ON CONFLICT DO NOTHING"
    fixes = processors(dialect, table, names)
    return RawInsert(f"{head}{row}{tail}", names, fixes, head, row, tail)


@functools.cache
def raw_last_seen(dialect: Dialect) -> RawStatement | None:
    """UPDATE a device's ``last_seen`` (parameters: ``seen``, ``device``)."""
    mark = _placeholder(dialect)
    if mark is None:
        return None
    table = Device.__table__
    quote = dialect.identifier_preparer.quote
    sql = (
        f"UPDATE {dialect.identifier_preparer.format_table(table)} "
        f"SET {quote('last_seen')} = {mark} WHERE {quote('id')} = {mark}"
    )
    return RawStatement(sql, ("seen", "device"), processors(dialect, table, ("last_seen", "id")))
