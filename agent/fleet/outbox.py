"""Telemetry and events waiting for the broker, on disk (SQLite), bounded and ordered.

Everything the device reports goes through here first, connected or not, so a restart or a
broker outage loses nothing that fits in the bounds. An event leaves once the broker
acknowledged it (QoS 1 PUBACK). A telemetry message leaves once the control plane says it
stored it (:class:`~common.protocol.messages.TelemetryAck`): a broker that restarts without
its state acknowledges messages it then delivers to no one. Until then it is sent again after
every reconnect, and while connected after ``resend_s`` (doubling per try, up to
``resend_max_s``). The broker's PUBACK never lets telemetry go, not even before the control
plane's first acknowledgement: a broker without persistence restarted in a device's first
seconds once lost those for good. A control plane that acknowledges nothing (one older than
the acknowledgements) is detected, not assumed: after ``UNACKED_WARNING`` sends of one row
with no acknowledgement ever, the outbox says so once in the log. Past ``max_bytes`` or
``max_age_s`` the oldest telemetry goes first (events only if telemetry alone cannot make
room), and every drop is counted.

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
    created REAL NOT NULL,
    seq INTEGER
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


ACKS_SEEN = "acks_seen"
"""Counter set once the control plane acknowledged telemetry, kept across restarts."""
UNACKED_WARNING = 4
"""Sends of one telemetry row, none acknowledged ever, before the outbox warns."""


@dataclass(frozen=True)
class Pending:
    id: int
    topic: str
    payload: bytes
    seq: int | None = None
    """The telemetry sequence number (None for events, and rows older than this column)."""
    kind: str = "telemetry"


class Outbox:
    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        max_age_s: float,
        resend_s: float = 8.0,
        resend_max_s: float = 900.0,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Used from one event loop at a time; the loop may run in another thread than the
        # one that built the outbox (tests serve in a thread).
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # WAL + NORMAL: durable across a killed process; fewer flash writes than FULL.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(outbox)")}
        if "seq" not in columns:  # an outbox written before telemetry was acknowledged
            self._db.execute("ALTER TABLE outbox ADD COLUMN seq INTEGER")
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.resend_s = resend_s
        self.resend_max_s = resend_max_s
        self._awaiting: dict[int, tuple[float, int]] = {}
        """Telemetry rows sent and not yet acknowledged by the control plane: id -> (when it is
        due again, on the monotonic clock; how many times it was sent)."""
        self._end_to_end = self._counter(ACKS_SEEN) > 0
        self._warned = False
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
                    "INSERT INTO outbox (topic, payload, kind, created, seq) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (topic, make(seq), kind, now, seq),
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
        if self._awaiting:  # forget what the bounds dropped
            kept = {
                i
                for (i,) in self._db.execute(
                    "SELECT id FROM outbox WHERE id >= ?", (min(self._awaiting),)
                )
            }
            for gone in [i for i in self._awaiting if i not in kept]:
                del self._awaiting[gone]

    def _count_dropped(self, kind: str, n: int) -> None:
        self._db.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            (f"dropped_{kind}", n),
        )

    def oldest(self, limit: int) -> list[Pending]:
        """The oldest rows to send now: not acknowledged, and not sent and awaiting the control
        plane's acknowledgement unless that is overdue. Ids are chosen first and only their
        payloads read: thousands of rows may await an acknowledgement."""
        now = time.monotonic()
        waiting = {i for i, (due, _) in self._awaiting.items() if due > now}
        skip = self._acked | waiting
        ids = [
            i
            for (i,) in self._db.execute(
                "SELECT id FROM outbox ORDER BY id LIMIT ?", (limit + len(skip),)
            )
            if i not in skip
        ][:limit]
        if not ids:
            # what awaited and is due but no longer stored (deleted meanwhile) is forgotten,
            # so that it is not due forever
            for i in [i for i, (due, _) in self._awaiting.items() if due <= now]:
                del self._awaiting[i]
            return []
        rows = self._db.execute(
            f"SELECT id, topic, payload, seq, kind FROM outbox WHERE id IN "
            f"({','.join('?' * len(ids))}) ORDER BY id",
            ids,
        )
        return [Pending(i, t, bytes(p), seq, k) for i, t, p, seq, k in rows.fetchall()]

    def published(self, items: list[Pending]) -> None:
        """The broker acknowledged ``items``: events leave; telemetry waits for the control
        plane's acknowledgement."""
        now = time.monotonic()
        done = []
        for item in items:
            if item.kind == "telemetry" and item.seq is not None:
                if not self._stored(item.id):
                    continue  # acknowledged by the control plane while the broker's ack came
                sent = self._awaiting.get(item.id, (0.0, 0))[1] + 1
                wait = min(self.resend_max_s, self.resend_s * 2 ** min(sent - 1, 32))
                self._awaiting[item.id] = (now + wait, sent)
                if sent >= UNACKED_WARNING and not self._end_to_end and not self._warned:
                    self._warned = True
                    log.warning(
                        "the control plane acknowledges no telemetry: it is kept and sent "
                        "again until it does (a control plane older than the agent?)",
                        extra={"sends": sent, "waiting": len(self._awaiting)},
                    )
            else:
                done.append(item.id)
        if done:
            self.ack(done)

    def _stored(self, row_id: int) -> bool:
        if row_id in self._acked:
            return False
        found = self._db.execute("SELECT 1 FROM outbox WHERE id = ?", (row_id,)).fetchone()
        return found is not None

    def acknowledge_telemetry(self, ranges: list[tuple[int, int]]) -> int:
        """The control plane stored these telemetry sequence numbers: their rows leave.

        Returns:
            How many rows left.
        """
        ids: list[int] = []
        try:
            for first, last in ranges:
                ids += [
                    i
                    for (i,) in self._db.execute(
                        "SELECT id FROM outbox WHERE kind = 'telemetry' AND seq BETWEEN ? AND ?",
                        (first, last),
                    )
                ]
        except sqlite3.Error as exc:
            self._refused(exc, "ack")
        for i in ids:
            self._awaiting.pop(i, None)
        if not self._end_to_end:
            self._end_to_end = True
            with contextlib.suppress(sqlite3.Error):
                with self._transaction():
                    self._db.execute(
                        "INSERT OR REPLACE INTO counters (name, value) VALUES (?, 1)",
                        (ACKS_SEEN,),
                    )
        self.ack(ids)
        return len(ids)

    def reconnected(self) -> None:
        """A new broker session: what awaits the control plane's acknowledgement is sent again
        now (a broker that lost its state lost it too), each later wait still doubling."""
        self._awaiting = {i: (0.0, sent) for i, (_, sent) in self._awaiting.items()}

    def next_due_s(self) -> float | None:
        """Seconds until a sent row is due to be sent again, None if none awaits."""
        if not self._awaiting:
            return None
        return max(0.0, min(due for due, _ in self._awaiting.values()) - time.monotonic())

    @property
    def end_to_end(self) -> bool:
        """Whether the control plane ever acknowledged telemetry (remembered across restarts)."""
        return self._end_to_end

    def ack(self, ids: list[int]) -> None:
        """Forget rows the broker acknowledged. If the storage refuses the delete, they are
        remembered and deleted with the next write that succeeds."""
        self._acked.update(ids)
        for i in ids:
            self._awaiting.pop(i, None)
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
        return self._counter(f"seq_{kind}")

    def _counter(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def dropped(self, kind: str) -> int:
        """Messages of ``kind`` lost: trimmed to the bounds, or refused by the storage."""
        row = self._db.execute(
            "SELECT value FROM counters WHERE name = ?", (f"dropped_{kind}",)
        ).fetchone()
        return (int(row[0]) if row else 0) + self._unstored.get(kind, 0)
