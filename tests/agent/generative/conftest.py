"""A loaded ``tiny-lm`` (the project's example, written once per module) on an event loop of
the module's own, so property tests can drive the real engine example after example."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.generative.engine import Engine
from agent.generative.models import GenerativeModels
from agent.generative.sampling import SamplingParams
from agent.generative.settings import GenerativeSettings
from agent.generative.streams import FinishReason, Generation
from runtimes.backends import open_model
from runtimes.examples import write_example_repository
from runtimes.hardware.context import HardwareContext
from runtimes.settings import RuntimeSettings


@dataclass
class Loaded:
    loop: asyncio.AbstractEventLoop
    models: GenerativeModels
    repository: Path

    @property
    def engine(self) -> Engine:
        return self.models.resolve("tiny-lm").engine

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)


async def generate(
    engine: Engine, prompt: str, params: SamplingParams
) -> tuple[str, FinishReason | None, int]:
    stream = engine.submit(Generation(engine.codec.encode(prompt), params))
    text, finish = [], None
    async for delta in stream:
        text.append(delta.text)
        finish = delta.finish
    return "".join(text), finish, stream.completion_tokens


def load(repository: Path, settings: GenerativeSettings) -> Loaded:
    loop = asyncio.new_event_loop()
    models = GenerativeModels(
        repository,
        HardwareContext.detect(),
        RuntimeSettings(intra_op_threads=1),
        settings,
        registry=CollectorRegistry(),
        runtime_factory=open_model,
    )
    loop.run_until_complete(models.load_all())
    assert models.errors == {}
    return Loaded(loop, models, repository)


@pytest.fixture(scope="module")
def lm_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lm")
    write_example_repository(root, models=("tiny-lm",))
    return root


@pytest.fixture(scope="module")
def lm(lm_repository: Path) -> Iterator[Loaded]:
    loaded = load(lm_repository, GenerativeSettings(max_sequences=16, prefill_chunk_tokens=8))
    yield loaded
    loaded.run(loaded.models.close())
    loaded.loop.close()
