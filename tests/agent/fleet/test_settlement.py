"""How an update ends, on its own: a real model manager over the example ``mlp`` (version 1
serving, version 2 switched to), a real store and state file, and the reports collected. No
broker, no downloads: the switch is made by hand, as the updater makes it."""

from __future__ import annotations

import asyncio
import errno
import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.fleet.outcome import Report, Settlement
from agent.fleet.settings import FleetSettings
from agent.fleet.state import FleetState, StateFiles
from agent.fleet.store import ModelStore
from agent.inference.manager import ModelManager
from agent.inference.versions import LoadedVersion
from common.model_config import ModelConfig, load_model_config
from common.protocol.errors import Rejection
from common.protocol.messages import ModelManifest, UpdateState
from common.protocol.signing import SigningKey, sign_envelope
from common.protocol.verify import VerifiedManifest
from runtimes.examples.repository import write_example_repository
from runtimes.hardware.context import HardwareContext
from runtimes.settings import RuntimeSettings

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def mlp_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("examples")
    write_example_repository(root, models=("mlp",))
    return root / "mlp"


@pytest.fixture
def repository(mlp_source: Path, tmp_path: Path) -> Path:
    """mlp with versions 1 (committed, serving) and 2 (installed by the fleet)."""
    model = Path(shutil.copytree(mlp_source, tmp_path / "repo" / "mlp"))
    shutil.copytree(model / "1", model / "2")
    with (model / "config.toml").open("a") as fh:
        fh.write("[version_policy]\nspecific = [1]\n")
    return model.parent


def manifest(version: int = 2, sequence: int = 7) -> VerifiedManifest:
    file = {"name": "model.onnx", "url": "http://127.0.0.1:1/x", "sha256": "a" * 64, "size": 10}
    doc = {
        "model": "mlp",
        "version": version,
        "sequence": sequence,
        "rollout_id": "r1",
        "artifacts": [{"format": "onnx", "files": [file]}],
        "issued_at": NOW.isoformat(),
        "expires_at": (NOW + timedelta(hours=1)).isoformat(),
    }
    m = ModelManifest.model_validate(doc)
    return VerifiedManifest(m, m.artifacts[0], "key", sign_envelope(doc, SigningKey.generate()))


class Ends:
    """A settlement over a real manager, store and state file, and what it reported."""

    def __init__(self, repository: Path, state_dir: Path) -> None:
        self.manager = ModelManager(
            repository,
            HardwareContext.detect(profile="generic-x86_64"),
            RuntimeSettings(),
            cpu_count=2,
        )
        self.store = ModelStore(repository)
        self.files = StateFiles(state_dir)
        self.state = FleetState()
        self.state.model("mlp").committed_version = 1
        self.reports: list[Report] = []
        self.changes = 0
        self.deferred: list[VerifiedManifest] = []
        self.settlement = Settlement(
            self.manager,
            self.store,
            self.files,
            self.state,
            FleetSettings(state_dir=state_dir),
            self.reports.append,
            self.changed,
            self.defer,
        )

    def changed(self) -> None:
        self.changes += 1

    def defer(self, vm: VerifiedManifest) -> float:
        self.deferred.append(vm)
        return 2.0

    async def switched(self) -> tuple[LoadedVersion, dict[int, LoadedVersion]]:
        """Version 1 serving, then version 2 staged and switched to."""
        await self.manager.load("mlp")
        config = ModelConfig.model_validate({"version_policy": {"specific": [2]}})
        staged = await self.manager.stage("mlp", 2, self.store.version_dir("mlp", 2), config)
        return staged, self.manager.activate("mlp", staged)

    def run(self, end: Callable[[LoadedVersion, dict[int, LoadedVersion]], None]) -> int:
        """Switch, end the update with ``end``, and return the version serving then."""

        async def scenario() -> int:
            try:
                staged, previous = await self.switched()
                end(staged, previous)
                return self.manager.resolve("mlp").version
            finally:
                await self.manager.close()

        return asyncio.run(scenario())


def test_a_commit_points_the_store_at_the_new_version_and_keeps_the_one_before(
    repository: Path, tmp_path: Path
) -> None:
    ends = Ends(repository, tmp_path / "state")
    vm = manifest()
    serving = ends.run(lambda staged, previous: ends.settlement.commit(vm.manifest, previous))
    assert serving == 2
    saved = ends.files.load_state().models["mlp"]
    assert (saved.committed_version, saved.committed_sequence, saved.previous_version) == (2, 7, 1)
    assert load_model_config(repository / "mlp").version_policy.specific == (2,)
    assert (repository / "mlp" / "1").is_dir()  # the version to roll back to
    assert ends.reports == []  # the updater says committed, once the commit held


def test_a_failed_window_switches_back_fails_the_sequence_and_removes_the_version(
    repository: Path, tmp_path: Path
) -> None:
    ends = Ends(repository, tmp_path / "state")
    vm = manifest()
    serving = ends.run(
        lambda staged, previous: ends.settlement.roll_back(vm.manifest, previous, staged, "slow")
    )
    assert serving == 1
    assert ends.reports == [
        Report(UpdateState.ROLLED_BACK, "mlp", 2, 7, "r1", Rejection.HEALTH_CHECK_FAILED, "slow")
    ]
    assert ends.files.load_state().models["mlp"].failed_sequence == 7
    assert not (repository / "mlp" / "2").exists()
    assert ends.changes == 1


def test_a_full_disk_at_the_commit_switches_back_and_retries_later(
    repository: Path, tmp_path: Path
) -> None:
    ends = Ends(repository, tmp_path / "state")
    vm = manifest()
    full = OSError(errno.ENOSPC, "No space left on device")
    serving = ends.run(
        lambda staged, previous: ends.settlement.switch_back(vm, previous, staged, full)
    )
    assert serving == 1
    (report,) = ends.reports
    assert (report.state, report.code) == (UpdateState.DOWNLOADING, Rejection.DISK_FULL)
    assert report.reason is not None and report.reason.endswith("retrying in 2 s")
    assert ends.deferred == [vm]
    assert ends.state.model("mlp").failed_sequence is None  # a retry, not a failure


def test_any_other_fault_at_the_commit_switches_back_for_good(
    repository: Path, tmp_path: Path
) -> None:
    ends = Ends(repository, tmp_path / "state")
    vm = manifest()
    bug = RuntimeError("a bug of ours")
    serving = ends.run(
        lambda staged, previous: ends.settlement.switch_back(vm, previous, staged, bug)
    )
    assert serving == 1
    (report,) = ends.reports
    assert (report.state, report.code) == (UpdateState.ROLLED_BACK, Rejection.LOAD_FAILED)
    assert report.reason == "could not be committed: RuntimeError: a bug of ours"
    assert ends.files.load_state().models["mlp"].failed_sequence == 7
    assert ends.deferred == []
