"""The outbox on a real SQLite file: what it reports waiting while the storage refuses to
delete what the broker acknowledged."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.fleet.outbox import Outbox


def test_pending_counts_the_rows_not_acknowledged_while_deletes_are_refused(
    tmp_path: Path,
) -> None:
    outbox = Outbox(tmp_path / "outbox.db", max_bytes=1 << 20, max_age_s=3600)
    for n in range(3):
        outbox.put("t", b"%d" % n, "telemetry")
    first, second, _ = (p.id for p in outbox.oldest(3))
    # Another connection holds the write lock: the delete of the acknowledged rows is refused
    # (after the connection's 5 s busy timeout) and the ids are remembered.
    blocker = sqlite3.connect(tmp_path / "outbox.db", isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        outbox.ack([first, second, 10_000])  # 10,000: an id no longer stored
        assert len(outbox) == 1  # stored less remembered ids gave 0
        assert [p.payload for p in outbox.oldest(3)] == [b"2"]
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    outbox.put("t", b"3", "telemetry")  # a write that succeeds deletes them
    assert len(outbox) == 2
    assert [p.payload for p in outbox.oldest(3)] == [b"2", b"3"]
    outbox.close()
