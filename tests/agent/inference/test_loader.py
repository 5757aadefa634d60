"""The version loader on its own, over the example ``mlp`` written by the project's generator:
no server, no manager. What a load returns and serves, what it records when it fails, and the
memory budget's say before anything opens."""

from __future__ import annotations

import asyncio
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent.errors import LoadError, MemoryBudgetError
from agent.inference.loader import VersionLoader
from agent.inference.manager import ModelEntry
from agent.inference.pipelined import PipelineVersion
from agent.inference.versions import LoadedVersion, VersionState, VersionStatus
from agent.pipelines.pipeline import ModelCall
from agent.pipelines.settings import PipelineSettings
from common.model_config import ModelConfig, load_model_config
from runtimes.backends import open_model
from runtimes.base import Placement, Runtime
from runtimes.errors import DeviceUnavailableError
from runtimes.examples.repository import write_example_repository
from runtimes.golden import GOLDEN_FILE, GoldenSample
from runtimes.hardware.context import HardwareContext
from runtimes.settings import RuntimeSettings


@pytest.fixture(scope="module")
def mlp_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("examples")
    write_example_repository(root, models=("mlp",))
    return root / "mlp"


@pytest.fixture
def mlp(mlp_source: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(mlp_source, tmp_path / "mlp"))


class Budget:
    """The manager's side of the memory budget: records what was asked, refuses on demand."""

    def __init__(self, refuse: bool = False) -> None:
        self.asked: list[tuple[str, int, str]] = []
        self.refuse = refuse

    async def make_room(self, model: str, needed: int, name: str) -> None:
        self.asked.append((model, needed, name))
        if self.refuse:
            raise MemoryBudgetError(f"{name} needs {needed} bytes")


class CountingFactory:
    """The runtime factory seam, counting the instances it opens; a device named in
    ``refusing`` is unavailable, as an accelerator that went away is."""

    def __init__(self, refusing: str = "") -> None:
        self.opened = 0
        self.tried: list[str] = []
        self.refusing = refusing

    def __call__(
        self, model_file: Path, placement: Placement, settings: RuntimeSettings
    ) -> Runtime:
        self.tried.append(placement.device)
        if placement.device == self.refusing:
            raise DeviceUnavailableError(f"{placement.device} is gone")
        self.opened += 1
        return open_model(model_file, placement, settings)


TWO_CANDIDATES = """
name = "two-candidates"
description = "an accelerator first, then the CPU"
priority = 100
[match]
architectures = ["x86_64"]
[[preferences.onnx]]
runtime = "onnxruntime"
device = "NPU"
providers = ["CPUExecutionProvider"]
[[preferences.onnx]]
runtime = "onnxruntime"
device = "CPU"
providers = ["CPUExecutionProvider"]
"""


@pytest.fixture
def two_candidates(tmp_path: Path) -> HardwareContext:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "two.toml").write_text(TWO_CANDIDATES)
    return HardwareContext.detect(profiles_dir=profiles, profile="two-candidates")


def no_pipeline(lv: PipelineVersion) -> ModelCall:
    raise AssertionError("a plain model has no pipeline to self-test")


def loader(
    budget: Budget,
    factory: CountingFactory,
    executor: ThreadPoolExecutor,
    hardware: HardwareContext | None = None,
) -> VersionLoader:
    return VersionLoader(
        hardware or HardwareContext.detect(profile="generic-x86_64"),
        RuntimeSettings(),
        cpu_count=2,
        cpus_limited=False,
        runtime_factory=factory,
        pipelines=PipelineSettings(),
        step_executor=executor,
        make_room=budget.make_room,
        caller_for=no_pipeline,
    )


async def _load(
    budget: Budget,
    factory: CountingFactory,
    entry: ModelEntry,
    version_dir: Path,
    config: ModelConfig,
    hardware: HardwareContext | None = None,
) -> LoadedVersion:
    with ThreadPoolExecutor(1) as executor:
        load = loader(budget, factory, executor, hardware).load
        return await load(entry, 1, version_dir, config)


def test_a_loaded_version_answers_its_golden_sample_through_its_batcher(mlp: Path) -> None:
    config = load_model_config(mlp).model_copy(update={"instances": 2})
    budget, factory, entry = Budget(), CountingFactory(), ModelEntry("mlp")

    async def scenario() -> None:
        lv = await _load(budget, factory, entry, mlp / "1", config)
        try:
            golden = GoldenSample.load(mlp / "1" / GOLDEN_FILE)
            rows = lv.signature.validate_inputs(golden.inputs)
            result = await lv.batcher.infer(golden.inputs, rows, priority=1, timeout_s=None)
            assert golden.mismatches(result.outputs) == []
            assert lv.placement.device == "CPU"
            assert lv.config.instances == 2 and factory.opened == 2
            assert lv.load_s > 0 and lv.memory_bytes > 0
        finally:
            await lv.retire()

    asyncio.run(scenario())
    # the manager, not the loader, says READY: until the switch the version is loading
    assert entry.status[1].state is VersionState.LOADING
    assert budget.asked and budget.asked[0][0] == "mlp" and budget.asked[0][2] == "mlp:1"
    assert budget.asked[0][1] > 0


def test_a_model_file_that_does_not_open_leaves_the_version_unavailable_with_why(
    mlp: Path,
) -> None:
    (mlp / "1" / "model.onnx").write_bytes(b"not a model")
    entry = ModelEntry("mlp")
    with pytest.raises(LoadError, match="model 'mlp' version 1") as caught:
        asyncio.run(_load(Budget(), CountingFactory(), entry, mlp / "1", load_model_config(mlp)))
    status = entry.status[1]
    assert status.state is VersionState.UNAVAILABLE
    assert status.reason and status.reason in str(caught.value)


def test_a_version_that_serves_keeps_its_status_when_its_reload_fails(mlp: Path) -> None:
    config = load_model_config(mlp)
    entry = ModelEntry("mlp")

    async def scenario() -> None:
        serving = await _load(Budget(), CountingFactory(), entry, mlp / "1", config)
        entry.served[1] = serving
        entry.status[1] = VersionStatus(VersionState.READY)
        try:
            (mlp / "1" / "model.onnx").write_bytes(b"broken since")
            with pytest.raises(LoadError):
                await _load(Budget(), CountingFactory(), entry, mlp / "1", config)
        finally:
            await serving.retire()

    asyncio.run(scenario())
    assert entry.status[1] == VersionStatus(VersionState.READY)


def test_a_version_the_budget_refuses_opens_nothing_and_keeps_the_budget_error(
    mlp: Path,
) -> None:
    factory, entry = CountingFactory(), ModelEntry("mlp")
    with pytest.raises(MemoryBudgetError, match="mlp:1 needs"):
        asyncio.run(_load(Budget(refuse=True), factory, entry, mlp / "1", load_model_config(mlp)))
    assert factory.opened == 0
    assert entry.status[1].state is VersionState.UNAVAILABLE


def test_a_version_without_a_model_file_fails_before_asking_for_room(mlp: Path) -> None:
    (mlp / "1" / "model.onnx").unlink()
    budget, entry = Budget(), ModelEntry("mlp")
    with pytest.raises(LoadError):
        asyncio.run(_load(budget, CountingFactory(), entry, mlp / "1", load_model_config(mlp)))
    assert budget.asked == []
    assert entry.status[1].state is VersionState.UNAVAILABLE


def test_measuring_the_batch_size_is_recorded_on_the_version(mlp: Path) -> None:
    config = ModelConfig.model_validate({"instances": 1, "batching": {"tune": True}})

    async def scenario() -> None:
        lv = await _load(Budget(), CountingFactory(), ModelEntry("mlp"), mlp / "1", config)
        try:
            assert lv.tuning is not None
            assert lv.batcher.config.max_batch_size <= config.batching.max_batch_size
        finally:
            await lv.retire()

    asyncio.run(scenario())


def test_a_device_that_is_gone_falls_back_to_the_profile_s_next_candidate(
    mlp: Path, two_candidates: HardwareContext
) -> None:
    factory = CountingFactory(refusing="NPU")
    config = load_model_config(mlp).model_copy(update={"instances": 1})

    async def scenario() -> str:
        lv = await _load(Budget(), factory, ModelEntry("mlp"), mlp / "1", config, two_candidates)
        await lv.retire()
        return lv.placement.describe()

    assert asyncio.run(scenario()) == "onnxruntime CPU via CPUExecutionProvider"
    assert factory.tried == ["NPU", "CPU"]


def test_a_pinned_device_that_is_gone_does_not_fall_back(
    mlp: Path, two_candidates: HardwareContext
) -> None:
    factory, entry = CountingFactory(refusing="NPU"), ModelEntry("mlp")
    pin = {"runtime": "onnxruntime", "device": "NPU"}
    config = ModelConfig.model_validate({"instances": 1, "placement": pin})
    with pytest.raises(LoadError, match="NPU is gone"):
        asyncio.run(_load(Budget(), factory, entry, mlp / "1", config, two_candidates))
    assert factory.tried == ["NPU"]
    assert entry.status[1].state is VersionState.UNAVAILABLE
