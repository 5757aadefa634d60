"""Fixtures for the fault tests: a private broker, the fleet test side, and what the tests
use to count telemetry end to end."""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from control_plane.db.session import sync_url

# the same broker, artifact server and fleet side as the fleet tests
from tests.agent.fleet.conftest import artifacts, broker, fleet

__all__ = ["artifacts", "broker", "fleet"]


def stored_seqs(db_url: str, device_id: str) -> set[int]:
    """Sequence numbers of the telemetry messages the control plane stored for a device."""
    engine = create_engine(sync_url(db_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT seq FROM device_telemetry WHERE device_id = :d"), {"d": device_id}
            )
            return {int(r[0]) for r in rows}
    finally:
        engine.dispose()


def missing_telemetry(
    db_url: str, device_id: str, produced: int, timeout_s: float = 60
) -> set[int]:
    """The sequence numbers 1..produced not stored, once all are or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while missing := set(range(1, produced + 1)) - stored_seqs(db_url, device_id):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)  # a database poll: the count only grows
    return missing


def oldest_held(state_dir: Path) -> float:
    """The oldest telemetry sequence number an agent's outbox still holds (inf if none)."""
    uri = f"file:{state_dir / 'outbox.sqlite3'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        (seq,) = db.execute("SELECT MIN(seq) FROM outbox WHERE kind = 'telemetry'").fetchone()
    return math.inf if seq is None else seq
