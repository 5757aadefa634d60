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
from tests.agent.fleet.publisher import Fleet
from tests.agent.fleet.test_updates import served
from tests.agent.server import serve, wait_until
from tests.control_plane.server import control_plane
from tests.control_plane.test_rollouts import push, rollout, validate, wait_rollout
from tests.mqtt_broker import Mosquitto, free_port

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


def test_disk_full_while_downloading_is_shown_on_the_rollout_old_version_serves_and_retries(
    small_disk: SmallDisk,
    broker: Mosquitto,
    example_repo: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    shutil.copytree(example_repo / "mlp", small_disk.path / "mlp")
    (small_disk.path / ".staging").mkdir()
    small_disk.resize(small_disk.used_bytes + 1 * MIB)  # the 5 MiB model file does not fit
    db_url = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
    with control_plane(tmp_path / "cp", db_url, broker.url, free_port()) as cp:
        settings = FleetSettings(
            mqtt_url=broker.url,
            device_id="dev-d",
            labels={"site": "lab"},
            state_dir=tmp_path / "state",
            trust_root_file=cp.trust_root_file,
            telemetry_interval_s=0.5,
            reconnect_min_s=0.05,
            reconnect_max_s=0.5,
        )
        with serve(small_disk.path, fleet=settings) as agent:
            baseline = small_disk.used_bytes
            push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
            assert validate(cp.admin, "mlp", 2)["passed"]
            rollout_id = rollout(cp, 2, waves=["100%"], device_timeout_s=300)

            def device_reason() -> str:
                doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
                return str(doc["devices"][0]["reason"] or "")

            wait_until(
                lambda: device_reason().startswith("disk_full:"),
                timeout_s=60,
                what="the disk_full report on the rollout",
            )
            reason = device_reason()
            assert "no space left" in reason and "retrying" in reason, reason
            assert served(agent)[0] == "1"  # the old version keeps serving
            deferred = [r for r in caplog.records if r.getMessage() == "update deferred"]
            assert deferred and deferred[0].__dict__["code"] == "disk_full"  # the device's log
            assert not list((small_disk.path / ".staging").iterdir())  # partial file removed
            assert not (small_disk.path / "mlp" / "2").exists()
            assert small_disk.used_bytes <= baseline + 64 * 1024
            assert agent.state.fleet is not None and agent.state.fleet.connected.is_set()
            small_disk.resize(256 * MIB)  # the operator makes room; the retry needs nothing else
            doc = wait_rollout(cp, rollout_id, "succeeded", "failed", "rolled_back")
            assert doc["state"] == "succeeded", doc
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
