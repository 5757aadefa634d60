"""Captured samples waiting for upload, on disk (SQLite), bounded per model.

Each sample is one row (its tensors as one ``.npz`` archive), written in one transaction:
a killed agent leaves a sample whole or absent. A model's samples are held to its policy's
``max_disk_bytes``, the oldest deleted first (counted by the caller as ``evicted``), and to
its ``retention_days`` (``expired``). A sample leaves once the control plane acknowledged it
(:meth:`CaptureSpool.delete`). Used by the capture writer thread and the fleet client's
event loop: every call holds one lock.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from common.protocol.capture import CaptureTrigger

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sample_id TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    captured_at REAL NOT NULL,
    trigger TEXT NOT NULL,
    rows INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_by_model ON samples (model, id);
"""


@dataclass(frozen=True)
class Sample:
    sample_id: str
    model: str
    version: int
    captured_at: float
    """Wall clock (seconds since the epoch): ages survive restarts."""
    trigger: CaptureTrigger
    rows: int
    data: bytes
    """The ``.npz`` archive of ``input:NAME`` and ``output:NAME`` arrays."""


class CaptureSpool:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, sample: Sample, max_disk_bytes: int) -> int:
        """Store ``sample``, then delete the model's oldest samples past ``max_disk_bytes``
        (the new one too, if it alone is larger); how many were deleted.

        Raises:
            sqlite3.Error: the storage refused it (the caller counts the sample dropped).
        """
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT OR IGNORE INTO samples (sample_id, model, version, captured_at, "
                "trigger, rows, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    sample.sample_id,
                    sample.model,
                    sample.version,
                    sample.captured_at,
                    sample.trigger.value,
                    sample.rows,
                    sample.data,
                ),
            )
            sizes = self._db.execute(
                "SELECT id, length(data) FROM samples WHERE model = ? ORDER BY id DESC",
                (sample.model,),
            ).fetchall()
            kept, over = 0, []
            for row_id, size in sizes:  # newest first: what is past the cap is the oldest
                kept += size
                if kept > max_disk_bytes:
                    over.append((row_id,))
            self._db.executemany("DELETE FROM samples WHERE id = ?", over)
        return len(over)

    def expire(self, model: str, retention_days: float, now: float | None = None) -> int:
        """Delete ``model``'s samples older than ``retention_days``; how many."""
        cutoff = (time.time() if now is None else now) - retention_days * 86400
        with self._lock, self._db:
            cursor = self._db.execute(
                "DELETE FROM samples WHERE model = ? AND captured_at < ?", (model, cutoff)
            )
        return cursor.rowcount

    def oldest(self, limit: int, skip: Iterable[str] = ()) -> list[Sample]:
        """Up to ``limit`` samples, oldest first, none of those in ``skip``."""
        skipped = set(skip)
        out: list[Sample] = []
        with self._lock:
            rows = self._db.execute(
                "SELECT sample_id, model, version, captured_at, trigger, rows, data "
                "FROM samples ORDER BY id LIMIT ?",
                (limit + len(skipped),),
            ).fetchall()
        for sid, model, version, at, trigger, rows_, data in rows:
            if sid not in skipped and len(out) < limit:
                out.append(Sample(sid, model, version, at, CaptureTrigger(trigger), rows_, data))
        return out

    def delete(self, sample_ids: Iterable[str]) -> dict[str, int]:
        """Delete these samples (acknowledged); how many per model were still here."""
        ids = list(sample_ids)
        gone: dict[str, int] = {}
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            for sid in ids:
                row = self._db.execute(
                    "DELETE FROM samples WHERE sample_id = ? RETURNING model", (sid,)
                ).fetchone()
                if row is not None:
                    gone[row[0]] = gone.get(row[0], 0) + 1
        return gone

    def pending(self) -> dict[str, tuple[int, int]]:
        """Per model: samples spooled and their bytes."""
        with self._lock:
            rows = self._db.execute(
                "SELECT model, count(*), coalesce(sum(length(data)), 0) FROM samples GROUP BY model"
            ).fetchall()
        return {model: (n, size) for model, n, size in rows}
