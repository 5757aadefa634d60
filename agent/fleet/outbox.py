"""Telemetry and events waiting for the broker, on disk (SQLite), bounded and ordered.

Everything the device reports goes through here first, connected or not, so a restart or a
broker outage loses nothing that fits in the bounds. Rows leave only when the broker
acknowledged them (QoS 1 PUBACK). Past ``max_bytes`` or ``max_age_s`` the oldest telemetry
goes first (events only if telemetry alone cannot make room), and every drop is counted.

Storage failures (a full disk, an I/O error) never reach the caller: a message that cannot be
stored is counted as dropped, in memory until a write succeeds again, and an acknowledgement
that cannot be deleted is remembered so the row is not sent again. The device stays on the
fleet while its disk refuses writes, and says what it lost once the disk is back.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("edgefleet.agent.fleet")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    kind TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class Pending:
    id: int
    topic: str
    payload: bytes


class Outbox:
    def __init__(self, path: Path, *, max_bytes: int, max_age_s: float) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Used from one event loop at a time; the loop may run in another thread than the
        # one that built the outbox (tests serve in a thread).
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # WAL + NORMAL: durable across a killed process; fewer flash writes than FULL.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._unstored: dict[str, int] = {}
        """Messages per kind the storage refused, not yet added to the stored counters."""
        self._acked: set[int] = set()
        """Rows the broker acknowledged that could not be deleted yet: never sent again."""
        self._failing = False

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        # isolation_level=None is autocommit: transactions are explicit, so each is atomic.
        if self._db.in_transaction:  # a ROLLBACK that failed with the storage, tried again
            self._db.execute("ROLLBACK")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            # what an earlier failed write left to do goes with the first one that succeeds
            self._settle()
            yield
            self._db.execute("COMMIT")
        except BaseException:
            # A failed COMMIT (a full disk) may have rolled back already, or not (NOTE:
            # https://www.sqlite.org/lang_transaction.html, "Response To Errors Within A
            # Transaction"); the original error is the one worth raising.
            if self._db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise
        lost = sum(self._unstored.values())
        self._unstored.clear()
        self._acked.clear()
        if self._failing:
            self._failing = False
            log.info("outbox storing again", extra={"lost": lost})

    def _settle(self) -> None:
        for kind, n in self._unstored.items():
            self._count_dropped(kind, n)
        self._db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in self._acked])

    def _refused(self, exc: sqlite3.Error, what: str) -> None:
        # once per streak: a device whose disk refuses writes would log every message otherwise
        if not self._failing:
            self._failing = True
            log.warning(
                "outbox cannot store, counting what is lost",
                extra={"error": str(exc), "operation": what},
            )

    def put(self, topic: str, payload: bytes, kind: str) -> None:
        """Queue a message; ages out and trims to the bounds (wall clock: ages survive restarts).
        A message the storage refuses is counted as dropped."""
        now = time.time()
        try:
            with self._transaction():
                self._db.execute(
                    "INSERT INTO outbox (topic, payload, kind, created) VALUES (?, ?, ?, ?)",
                    (topic, payload, kind, now),
                )
                self._trim(now)
        except sqlite3.Error as exc:
            self._unstored[kind] = self._unstored.get(kind, 0) + 1
            self._refused(exc, "put")

    def put_numbered(self, topic: str, make: Callable[[int], bytes], kind: str) -> int | None:
        """Queue ``make(seq)`` with the next number of a counter that survives restarts; the
        number and the row are written in one transaction, so no number repeats or vanishes.

        Returns:
            The number, or None if the storage refused the message (counted as dropped; the
            number is given to the next message, and ``dropped`` tells what is missing).
        """
        now = time.time()
        try:
            with self._transaction():
                row = self._db.execute(
                    "SELECT value FROM counters WHERE name = ?", (f"seq_{kind}",)
                ).fetchone()
                seq = (row[0] if row else 0) + 1
                self._db.execute(
                    "INSERT OR REPLACE INTO counters (name, value) VALUES (?, ?)",
                    (f"seq_{kind}", seq),
                )
                self._db.execute(
                    "INSERT INTO outbox (topic, payload, kind, created) VALUES (?, ?, ?, ?)",
                    (topic, make(seq), kind, now),
                )
                self._trim(now)
        except sqlite3.Error as exc:
            self._unstored[kind] = self._unstored.get(kind, 0) + 1
            self._refused(exc, "put")
            return None
        return seq

    def _trim(self, now: float) -> None:
        for kind, n in self._db.execute(
            "SELECT kind, COUNT(*) FROM outbox WHERE created < ? GROUP BY kind",
            (now - self.max_age_s,),
        ).fetchall():
            self._count_dropped(kind, n)
        self._db.execute("DELETE FROM outbox WHERE created < ?", (now - self.max_age_s,))
        size = self.size_bytes()
        for kind in ("telemetry", "event"):
            while size > self.max_bytes:
                row = self._db.execute(
                    "SELECT id, length(payload) FROM outbox WHERE kind = ? ORDER BY id LIMIT 1",
                    (kind,),
                ).fetchone()
                if row is None:
                    break
                self._db.execute("DELETE FROM outbox WHERE id = ?", (row[0],))
                self._count_dropped(kind, 1)
                size -= row[1]

    def _count_dropped(self, kind: str, n: int) -> None:
        self._db.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            (f"dropped_{kind}", n),
        )

    def oldest(self, limit: int) -> list[Pending]:
        rows = self._db.execute(
            "SELECT id, topic, payload FROM outbox ORDER BY id LIMIT ?",
            (limit + len(self._acked),),
        )
        pending = [Pending(i, t, bytes(p)) for i, t, p in rows.fetchall() if i not in self._acked]
        return pending[:limit]

    def ack(self, ids: list[int]) -> None:
        """Forget rows the broker acknowledged. If the storage refuses the delete, they are
        remembered and deleted with the next write that succeeds."""
        self._acked.update(ids)
        try:
            with self._transaction():
                pass  # the delete is in what every successful transaction settles
        except sqlite3.Error as exc:
            self._refused(exc, "ack")

    def __len__(self) -> int:
        """Messages waiting for the broker: the rows stored and not acknowledged, counted in one
        statement. (Stored rows less the acknowledged ids was wrong while acknowledged rows were
        being deleted, negative when read from another thread meanwhile, and wrong for an
        acknowledged id no longer stored.)"""
        acked = set(self._acked)
        if not acked:
            return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
        ids = self._db.execute("SELECT id FROM outbox").fetchall()
        return sum(1 for (i,) in ids if i not in acked)

    def size_bytes(self) -> int:
        return int(
            self._db.execute("SELECT COALESCE(SUM(length(payload)), 0) FROM outbox").fetchone()[0]
        )

    def last_seq(self, kind: str) -> int:
        row = self._db.execute(
            "SELECT value FROM counters WHERE name = ?", (f"seq_{kind}",)
        ).fetchone()
        return int(row[0]) if row else 0

    def dropped(self, kind: str) -> int:
        """Messages of ``kind`` lost: trimmed to the bounds, or refused by the storage."""
        row = self._db.execute(
            "SELECT value FROM counters WHERE name = ?", (f"dropped_{kind}",)
        ).fetchone()
        return (int(row[0]) if row else 0) + self._unstored.get(kind, 0)
