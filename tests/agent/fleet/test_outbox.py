"""The outbox on a real SQLite file: what it reports waiting while the storage refuses to
delete what the broker acknowledged."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agent.fleet.outbox import Outbox


@pytest.mark.slow
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


def _telemetry(outbox: Outbox, n: int) -> list[int]:
    return [
        seq
        for _ in range(n)
        if (seq := outbox.put_numbered("t", lambda s: b"%d" % s, "telemetry")) is not None
    ]


def test_telemetry_stays_until_the_control_plane_acknowledges_it(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "o.db", max_bytes=1 << 20, max_age_s=3600, resend_s=60)
    assert _telemetry(outbox, 3) == [1, 2, 3]
    # before any acknowledgement from the control plane, too: the broker's PUBACK is not
    # enough (a broker without persistence restarted then lost those rows for good)
    assert not outbox.end_to_end
    outbox.published(outbox.oldest(1))
    assert [p.seq for p in outbox.oldest(10)] == [2, 3] and len(outbox) == 3
    outbox.acknowledge_telemetry([(1, 1)])  # the control plane stored it: it leaves
    assert outbox.end_to_end and len(outbox) == 2
    sent = outbox.oldest(10)
    outbox.published(sent)
    assert outbox.oldest(10) == [] and len(outbox) == 2  # kept, not sent again yet
    assert 59 < (outbox.next_due_s() or 0) <= 60
    assert outbox.acknowledge_telemetry([(3, 3), (7, 9)]) == 1
    assert len(outbox) == 1
    outbox.reconnected()  # a new broker session: what awaits goes again at once
    assert [p.seq for p in outbox.oldest(10)] == [2]
    outbox.published(outbox.oldest(10))
    assert 119 < (outbox.next_due_s() or 0) <= 120  # the second wait is twice as long
    outbox.close()
    reopened = Outbox(tmp_path / "o.db", max_bytes=1 << 20, max_age_s=3600)
    assert reopened.end_to_end  # remembered across restarts
    assert [p.seq for p in reopened.oldest(10)] == [2]  # and sent again after one
    assert reopened.acknowledge_telemetry([(1, 2)]) == 1
    assert len(reopened) == 0 and reopened.next_due_s() is None


def test_a_control_plane_that_never_acknowledges_is_told_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path / "o.db", max_bytes=1 << 20, max_age_s=3600, resend_s=60)
    _telemetry(outbox, 2)
    for _ in range(6):  # sent and taken by the broker six times, never acknowledged
        outbox.reconnected()
        outbox.published(outbox.oldest(10))
    assert len(outbox) == 2  # nothing lost
    warned = [r for r in caplog.records if "acknowledges no telemetry" in r.getMessage()]
    assert len(warned) == 1


def test_events_leave_on_the_brokers_acknowledgement(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "o.db", max_bytes=1 << 20, max_age_s=3600)
    _telemetry(outbox, 1)
    outbox.acknowledge_telemetry([(1, 1)])
    outbox.put("e", b"event", "event")
    outbox.published(outbox.oldest(10))
    assert len(outbox) == 0


def test_the_bound_drops_unacknowledged_telemetry_and_counts_it(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "o.db", max_bytes=1 << 20, max_age_s=3600)
    _telemetry(outbox, 1)
    outbox.acknowledge_telemetry([(1, 1)])
    _telemetry(outbox, 5)
    outbox.published(outbox.oldest(10))
    outbox.max_bytes = 2  # room for two one-byte payloads
    _telemetry(outbox, 1)
    assert [p.seq for p in outbox.oldest(10)] == [7]  # 6 still awaits its ack; 2-5 dropped
    assert outbox.dropped("telemetry") == 4
    assert len(outbox) == 2
    outbox.reconnected()
    assert [p.seq for p in outbox.oldest(10)] == [6, 7]


def test_an_outbox_written_before_acknowledgements_gains_the_seq_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, "
            "payload BLOB NOT NULL, kind TEXT NOT NULL, created REAL NOT NULL)"
        )
        db.execute(
            "INSERT INTO outbox (topic, payload, kind, created) VALUES ('t', X'78', 'telemetry', 0)"
        )
    outbox = Outbox(path, max_bytes=1 << 20, max_age_s=1e12)
    outbox.acknowledge_telemetry([(1, 5)])  # an old row has no seq: the broker's ack frees it
    (old,) = outbox.oldest(10)
    assert old.seq is None
    outbox.published([old])
    assert len(outbox) == 0


def test_a_row_acknowledged_while_its_publish_was_in_flight_is_not_awaited(
    tmp_path: Path,
) -> None:
    """The control plane's acknowledgement can overtake the broker's PUBACK (a resend after a
    reconnect): the row is gone, and nothing may stay due for it (the drain would spin)."""
    outbox = Outbox(tmp_path / "o.db", max_bytes=1 << 20, max_age_s=3600, resend_s=0.01)
    _telemetry(outbox, 2)
    outbox.acknowledge_telemetry([(1, 1)])
    in_flight = outbox.oldest(10)
    assert [p.seq for p in in_flight] == [2]
    outbox.acknowledge_telemetry([(2, 2)])  # before the broker's PUBACK of it
    outbox.published(in_flight)
    assert outbox.next_due_s() is None and outbox.oldest(10) == []
