"""Engines, sessions and migrations. SQLite (aiosqlite) by default, PostgreSQL (psycopg) by URL."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

SQLITE_CACHE_KIB = 64 * 1024
SQLITE_MMAP_BYTES = 1024 * 2**20
SQLITE_CHECKPOINT_PAGES = 10_000
MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"


def stored_utc(at: datetime) -> datetime:
    """A timestamp read back from the database, as an aware UTC datetime: SQLite keeps the
    UTC wall time and drops the zone."""
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def required_utc(at: datetime | None) -> datetime:
    """A stored timestamp that must be set, as an aware UTC datetime.

    Raises:
        ValueError: it is not set.
    """
    if at is None:
        raise ValueError("timestamp is not set")
    return stored_utc(at)


def sync_url(url: str) -> str:
    """The same database through a synchronous driver (for migrations)."""
    u = make_url(url)
    if u.drivername == "sqlite+aiosqlite":
        u = u.set(drivername="sqlite")
    return u.render_as_string(hide_password=False)


def _prepare_sqlite_dir(url: str) -> None:
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)


def database_exists(url: str) -> bool:
    """Whether ``url`` names a control plane database: one with the migrations' version table
    (for SQLite, in a file that exists: looking does not create it).

    Raises:
        sqlalchemy.exc.ArgumentError: ``url`` is not a database URL (or names no driver here).
        sqlalchemy.exc.DBAPIError: the database server cannot be reached.
    """
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and not (
        u.database and u.database != ":memory:" and Path(u.database).is_file()
    ):
        return False
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            return inspect(conn).has_table("alembic_version")
    finally:
        engine.dispose()


def describe(url: str) -> str:
    """The database ``url`` names, for an operator: an SQLite file's absolute path, else the
    URL without its password."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        return f"the SQLite file {Path(u.database).absolute()}"
    return u.render_as_string(hide_password=True)


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def migrate(url: str) -> None:
    """Bring the schema to the newest revision (idempotent)."""
    _prepare_sqlite_dir(url)
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
    finally:
        engine.dispose()


def make_engine(url: str) -> AsyncEngine:
    _prepare_sqlite_dir(url)
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        engine = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            # The telemetry indexes outgrow SQLite's default 2 MiB page cache within minutes
            # of a fleet's telemetry; past that every insert read index pages back through
            # system calls (most of ingest's database time). Memory-mapped reads and a larger
            # cache (per connection, filled only as used) keep them in memory.
            cursor.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
            cursor.execute(f"PRAGMA mmap_size={SQLITE_MMAP_BYTES}")
            # A batch of telemetry dirties index pages all over the file: with the default
            # (a checkpoint, and its fsync, once the log holds 1,000 pages) nearly every
            # commit paid for a checkpoint (30 ms here, 94 us per message). Checkpoints of
            # ten times that many pages cost about the same each.
            cursor.execute(f"PRAGMA wal_autocheckpoint={SQLITE_CHECKPOINT_PAGES}")
            cursor.close()

        return engine
    # pre-ping: a restarted PostgreSQL costs one failed check, not a failed request
    return create_async_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def database_unavailable(exc: DBAPIError) -> bool:
    """The database cannot be reached or cannot take the statement now (restarting, failing
    over, locked), as opposed to refusing it: worth retrying, and a 503 for an API client."""
    return isinstance(exc, (OperationalError, InterfaceError)) or exc.connection_invalidated
