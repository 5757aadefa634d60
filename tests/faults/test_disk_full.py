"""Disk full while an update downloads: the model repository (and its staging directory) is a
small tmpfs, so writes fail with a real ENOSPC. The device reports a clear error, keeps
serving the old version, removes the partial file, and completes the update once there is
room again. Needs root (mount); skipped otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.fleet.settings import FleetSettings
from runtimes.examples.variants import mlp_version
from tests.agent.server import serve
from tests.fleet.publisher import Fleet
from tests.fleet.test_updates import served
from tests.mqtt_broker import Mosquitto

pytestmark = pytest.mark.slow
MIB = 2**20


class SmallDisk:
    """A tmpfs mounted at ``path``, resized with ``remount``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mount(self, size_bytes: int) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(self.path)],
            check=True,
            capture_output=True,
            timeout=30,
        )

    def resize(self, size_bytes: int) -> None:
        subprocess.run(
            ["mount", "-o", f"remount,size={size_bytes}", str(self.path)],
            check=True,
            capture_output=True,
            timeout=30,
        )

    @property
    def used_bytes(self) -> int:
        return shutil.disk_usage(self.path).used

    def unmount(self) -> None:
        subprocess.run(
            ["umount", "-l", str(self.path)], check=False, capture_output=True, timeout=30
        )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = SmallDisk(tmp_path / "repo")
    try:
        disk.mount(256 * MIB)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield disk
    finally:
        disk.unmount()  # always, even when the test failed


def _device(
    small_disk: SmallDisk,
    fleet: Fleet,
    broker: Mosquitto,
    example_repo: Path,
    tmp_path: Path,
    room_bytes: int,
) -> FleetSettings:
    """A repository on the small disk with mlp version 1 and ``room_bytes`` free."""
    shutil.copytree(example_repo / "mlp", small_disk.path / "mlp")
    (small_disk.path / ".staging").mkdir()
    small_disk.resize(small_disk.used_bytes + room_bytes)
    return FleetSettings(
        mqtt_url=broker.url,
        device_id="dev-d",
        state_dir=tmp_path / "state",
        trust_root_file=fleet.write_trust_root(tmp_path / "trust.json"),
        telemetry_interval_s=0.5,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )


def test_disk_full_while_downloading_reports_it_keeps_serving_cleans_up_and_retries(
    small_disk: SmallDisk, fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    settings = _device(small_disk, fleet, broker, example_repo, tmp_path, 1 * MIB)
    v2 = mlp_version(tmp_path / "v2", seed=2)  # a 5 MiB model file: it does not fit
    with serve(small_disk.path, fleet=settings) as agent:
        baseline = small_disk.used_bytes
        fleet.publish_desired("dev-d", fleet.sign(fleet.manifest("mlp", 2, 1, v2)))
        event = fleet.wait(
            lambda: next((e for e in fleet.events("dev-d") if e.code == "disk_full"), None),
            what="the disk_full report",
        )
        assert event.state.value == "downloading" and event.sequence == 1
        assert event.reason and "no space left" in event.reason and "retrying" in event.reason
        assert served(agent)[0] == "1"  # the old version keeps serving
        assert not list((small_disk.path / ".staging").iterdir())  # the partial file is gone
        assert not (small_disk.path / "mlp" / "2").exists()
        assert small_disk.used_bytes <= baseline + 64 * 1024
        assert agent.state.fleet is not None and agent.state.fleet.connected.is_set()
        small_disk.resize(256 * MIB)  # the operator makes room; the retry needs nothing else
        fleet.wait_event("dev-d", "committed", sequence=1)
        assert served(agent)[0] == "2"
    assert not list((small_disk.path / ".staging").iterdir())


def test_room_for_one_copy_of_the_update_is_enough(
    small_disk: SmallDisk, fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    v2 = mlp_version(tmp_path / "v2", seed=2)
    size = sum(p.stat().st_size for p in v2.iterdir())
    # the verified download becomes the installed file (a hard link), not a second copy
    settings = _device(small_disk, fleet, broker, example_repo, tmp_path, size + size // 2)
    with serve(small_disk.path, fleet=settings) as agent:
        fleet.publish_desired("dev-d", fleet.sign(fleet.manifest("mlp", 2, 1, v2)))
        fleet.wait_event("dev-d", "committed", sequence=1)
        assert served(agent)[0] == "2"
        assert not [e for e in fleet.events("dev-d") if e.code == "disk_full"]
        assert agent.state.fleet is not None and agent.state.fleet.connected.is_set()
