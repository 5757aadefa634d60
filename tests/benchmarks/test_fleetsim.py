"""The fleet benchmark's simulator against a real Mosquitto and a real control plane process:
50 simulated devices complete a rollout and a fleet-wide rollback, report the update states
in the agent's order, and every telemetry message they send is stored. Counts, not times."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

import pytest

from benchmarks.fleet import phases
from benchmarks.fleet.measure import Fleet, start_fleet

# one simulated fleet for the module, each test building on the one before
pytestmark = pytest.mark.slow

DEVICES = 50
UPDATE_ORDER = ["received", "downloading", "downloading", "verified", "staged", "active"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("fleetsim")
    with ExitStack() as stack:
        yield start_fleet(stack, workdir, DEVICES, sim_procs=2, interval_s=5.0)


def _events(workdir_db: Path, rollout_id: int) -> dict[str, list[str]]:
    with contextlib.closing(sqlite3.connect(f"file:{workdir_db}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT device_id, state FROM update_events WHERE rollout_id = ? ORDER BY id",
            (f"rollout-{rollout_id}",),
        ).fetchall()
    out: dict[str, list[str]] = {}
    for device_id, state in rows:
        out.setdefault(device_id, []).append(state)
    return out


def test_rollout_and_rollback_reach_every_simulated_device(fleet: Fleet) -> None:
    result = phases.rollout_and_rollback(fleet, version=2, timeout_s=120)

    assert result["rollout"]["states"] == {"committed": DEVICES}
    assert result["rollback"]["states"] == {"reverted": DEVICES}
    assert fleet.db.rollout_state(result["rollout_id"]) == "rolled_back"
    # the devices' own view: each published committed, then rolled_back on the command
    assert result["rollout"]["device_view_99pct_s"] is not None
    assert result["rollback"]["device_view_99pct_s"] is not None
    stats = fleet.stats()
    assert stats["versions"] == {"1": DEVICES}
    assert stats["rejected"] == {}
    assert stats["lost"] == 0

    db_path = Path(fleet.db.conn.execute("PRAGMA database_list").fetchone()[2])
    events = _events(db_path, result["rollout_id"])
    assert len(events) == DEVICES
    for states in events.values():  # the updater's order, as a real agent reports it
        assert states[: len(UPDATE_ORDER)] == UPDATE_ORDER
        assert states[-1] == "committed"


def test_simulated_devices_announce_their_telemetry_interval(fleet: Fleet) -> None:
    """As an agent does in its birth message: the control plane's silence limit uses it."""
    rows = fleet.db.conn.execute(
        "SELECT telemetry_interval_s, COUNT(*) FROM devices GROUP BY telemetry_interval_s"
    ).fetchall()
    assert rows == [(5.0, DEVICES)]


def test_second_rollout_skips_the_download_of_a_version_kept_on_the_device(fleet: Fleet) -> None:
    result = phases.rollout_and_rollback(fleet, version=2, timeout_s=120)

    assert result["rollout"]["states"] == {"committed": DEVICES}
    assert result["rollback"]["states"] == {"reverted": DEVICES}
    db_path = Path(fleet.db.conn.execute("PRAGMA database_list").fetchone()[2])
    for states in _events(db_path, result["rollout_id"]).values():
        assert states == ["received", "verified", "staged", "active", "committed"]


def test_every_telemetry_message_sent_is_stored(fleet: Fleet) -> None:
    step = phases.ingest_step(fleet, rate_per_s=200, duration_s=2.0, drain_s=60.0)

    assert step["sent"] > 0
    assert step["lost_in_run"] == 0  # every telemetry message of the run, not just this step


def test_the_bare_subscriber_counts_everything_the_broker_delivers(fleet: Fleet) -> None:
    bare = phases.bare_rate(fleet, duration_s=1.0)

    assert bare["sent"] > 0
    assert bare["delivered"] == bare["sent"]


def test_ingest_sweep_halves_the_gap_at_the_limit_with_a_stand_in_measurement() -> None:
    """The search alone: a stand-in step (no fleet: ingest_sweep's measure seam) passes up to
    20,000 messages/s."""
    offered: list[float] = []

    def step(_fleet: Fleet, rate: float, _duration_s: float, drain_s: float) -> dict[str, Any]:
        offered.append(rate)
        return {
            "offered_per_s": rate,
            "sent_per_s": rate,
            "stored_per_s_during": min(rate, 20_000),
            "passed": rate <= 20_000,
        }

    fleet = cast(Fleet, None)  # the stand-in measures nothing
    sweep = phases.ingest_sweep(fleet, 2000, 1.25, 50_000, 8.0, refine=2, measure=step)
    assert offered[-4:] == [18624, 23280, 20952, 19788]
    assert sweep["max_lossless_per_s"] == 19788
    assert sweep["peak_stored_per_s"] == 20_000
