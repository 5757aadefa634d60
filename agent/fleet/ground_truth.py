"""Joined outcomes waiting for the next telemetry window, on disk (SQLite).

A feedback post's outcomes are summed into this journal before the app gets its answer, per
model version and true label; each telemetry round takes every sum into the window's message
(:class:`~common.protocol.ground_truth.GroundTruthReport` on the version's entry), and once
the outbox holds that message the sums taken leave the journal. From then on the outbox keeps
them until the control plane acknowledges the window, across restarts and broker outages.

A crash between the outbox's write and the journal's delete sends those sums twice (at least
once, never lost); the journal holds one row per version and label, so it stays small however
many outcomes arrive between windows.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from agent.errors import StorageError
from agent.inference.predictions import OutcomeSums
from common.protocol.ground_truth import (
    MAX_GROUPS,
    GroundTruthReport,
    GroundTruthTask,
    OutcomeGroup,
)
from common.protocol.messages import ModelTelemetry

log = logging.getLogger("edgefleet.agent.fleet")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outcomes (
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    task TEXT NOT NULL,
    label INTEGER NOT NULL,
    outcomes INTEGER NOT NULL,
    correct INTEGER NOT NULL,
    abs_error_sum REAL NOT NULL,
    squared_error_sum REAL NOT NULL,
    PRIMARY KEY (model, version, label)
);
"""
_ADD = """
INSERT INTO outcomes VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (model, version, label) DO UPDATE SET
    outcomes = outcomes + excluded.outcomes,
    correct = correct + excluded.correct,
    abs_error_sum = abs_error_sum + excluded.abs_error_sum,
    squared_error_sum = squared_error_sum + excluded.squared_error_sum
"""

Taken = dict[tuple[str, int], GroundTruthReport]


class OutcomeJournal:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def add(self, sums: OutcomeSums) -> None:
        """Store a post's joined outcomes (one transaction: all of them or none).

        Raises:
            StorageError: the storage refused them; the post fails (503), and the app may
                post them again.
        """
        rows = [
            (m, v, task.value, label, s.outcomes, s.correct, s.abs_error_sum, s.squared_error_sum)
            for (m, v, task, label), s in sums.groups.items()
        ]
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(_ADD, rows)
        except sqlite3.Error as exc:
            raise StorageError(f"outcomes cannot be stored on this device: {exc}") from exc

    def take(self) -> Taken:
        """The pending sums, as one report per model version (at most ``MAX_GROUPS`` labels
        each: more wait for the next window)."""
        out: Taken = {}
        try:
            rows = self._db.execute("SELECT * FROM outcomes ORDER BY model, version, label")
            pending = rows.fetchall()
        except sqlite3.Error as exc:  # the window goes without them; they wait for the next
            log.warning("ground truth journal unreadable", extra={"error": str(exc)})
            return out
        for row in pending:
            model, version, task, label, n, correct, abs_sum, sq_sum = row
            group = OutcomeGroup(
                label=label,
                outcomes=n,
                correct=correct,
                abs_error_sum=abs_sum,
                squared_error_sum=sq_sum,
            )
            report = out.get((model, version))
            if report is None:
                out[model, version] = GroundTruthReport(task=GroundTruthTask(task), groups=[group])
            elif len(report.groups) < MAX_GROUPS:  # the rest wait for the next window
                report.groups.append(group)
        return out

    def sent(self, taken: Taken) -> None:
        """The outbox holds ``taken``: it leaves the journal (sums added since stay)."""
        rows = [
            (g.outcomes, g.correct, g.abs_error_sum, g.squared_error_sum, m, v, g.label)
            for (m, v), report in taken.items()
            for g in report.groups
        ]
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                "UPDATE outcomes SET outcomes = outcomes - ?, correct = correct - ?, "
                "abs_error_sum = abs_error_sum - ?, squared_error_sum = squared_error_sum - ? "
                "WHERE model = ? AND version = ? AND label = ?",
                rows,
            )
            self._db.execute("DELETE FROM outcomes WHERE outcomes <= 0")


def attach(models: list[ModelTelemetry], taken: Taken) -> list[ModelTelemetry]:
    """The window's entries with each version's report on it; a version with outcomes and no
    entry (replaced since its predictions) gets one of its own, with no requests."""
    by_version = {(m.model, m.version): m for m in models}
    for (model, version), report in taken.items():
        entry = by_version.get((model, version))
        if entry is None:
            entry = ModelTelemetry(
                model=model, version=version, requests=0, errors=0, rows=0, batches=0
            )
            models.append(entry)
        entry.ground_truth = report
    return models
