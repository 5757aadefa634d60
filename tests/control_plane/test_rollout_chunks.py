"""A wave sent a chunk at a time, against a real Mosquitto, a real control plane process and the
fleet benchmark's simulated devices: each chunk is its own transaction (one ``sent_at`` per
chunk), every device commits, and the control plane run under cProfile (the benchmark's
``--profile-dir``) leaves a profile that names the sending. Counts, not times."""

from __future__ import annotations

import math
import pstats
from contextlib import ExitStack
from pathlib import Path

import pytest

from benchmarks.fleet.measure import start_fleet
from benchmarks.fleet.stack import MODEL, wait_for

pytestmark = pytest.mark.slow

DEVICES = 20
CHUNK = 6


def test_a_wave_goes_out_a_chunk_per_transaction_and_every_device_commits(
    tmp_path: Path,
) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    with ExitStack() as stack:
        fleet = start_fleet(
            stack,
            tmp_path / "fleet",
            DEVICES,
            sim_procs=1,
            interval_s=5.0,
            control_plane_env={"EDGEFLEET_CP_ROLLOUT_SEND_CHUNK_DEVICES": str(CHUNK)},
            profile_dir=profiles,
        )
        spec = {
            "model": MODEL,
            "version": 2,
            "selector": {"fleet": "sim"},
            "waves": ["100%"],
            "bake_time_s": 3600,
            "gates": {"max_rejections": DEVICES},
        }
        resp = fleet.api.post("/api/v1/rollouts", json=spec)
        resp.raise_for_status()
        rollout_id = int(resp.json()["id"])
        wait_for(
            "every device committed",
            lambda: fleet.db.rollout_states(rollout_id) == {"committed": DEVICES},
            120,
        )
        chunks = fleet.db.scalar(
            "SELECT count(DISTINCT sent_at) FROM rollout_devices WHERE rollout_id = ?",
            rollout_id,
        )
        assert chunks == math.ceil(DEVICES / CHUNK)
        assert fleet.stats()["versions"] == {"2": DEVICES}
    # the control plane stopped (SIGTERM) and wrote its profile on the way out
    stats = pstats.Stats(str(profiles / "control-plane.prof"))
    functions = {name for _, _, name in stats.stats}  # type: ignore[attr-defined]
    assert "_send_pending" in functions
