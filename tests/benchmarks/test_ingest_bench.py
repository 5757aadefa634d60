"""``python -m benchmarks.fleet.ingest``: two code trees' control planes in turn against a
real Mosquitto and simulator, each run's messages all stored and its CPU per message given.
Counts and presence, not speeds."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import control_plane
from benchmarks.fleet.ingest import compare, parse_tree

REPO = Path(control_plane.__file__).resolve().parent.parent


@pytest.mark.slow
def test_each_tree_runs_its_own_control_plane_and_every_message_is_stored() -> None:
    report = compare(
        [("installed", None), ("tree", REPO)], devices=20, rate_per_s=100, duration_s=1.5, rounds=1
    )
    installed, tree = report["trees"]
    assert [installed["name"], tree["name"]] == ["installed", "tree"]
    # the tree's control plane ran with the tree first on its path, the other without it
    assert tree["runs"][0]["control_plane_pythonpath"] == str(REPO)
    assert str(REPO) not in installed["runs"][0]["control_plane_pythonpath"]
    for entry in (installed, tree):
        (run,) = entry["runs"]
        assert run["sent"] > 0 and run["stored"] == run["sent"] and run["lost"] == 0, run
        assert run["control_plane_us_per_message"] > 0, run
        assert run["event_loop_us_per_message"] > 0, run
        assert entry["median_control_plane_us_per_message"] == run["control_plane_us_per_message"]


def test_a_tree_without_a_control_plane_is_refused(tmp_path: Path) -> None:
    assert parse_tree("now=.") == ("now", None)
    with pytest.raises(argparse.ArgumentTypeError, match="no control_plane"):
        parse_tree(f"before={tmp_path}")
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=PATH"):
        parse_tree(str(tmp_path))
