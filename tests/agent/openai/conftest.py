"""A real agent on 127.0.0.1 serving the example ``tiny-lm`` (and ``mlp`` beside it), for the
official ``openai`` client and raw HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from runtimes.examples import write_example_repository
from tests.agent.server import RunningAgent, serve

MODEL = "tiny-lm"


@pytest.fixture(scope="module")
def lm_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("openai")
    write_example_repository(root, models=("tiny-lm", "mlp"))
    return root


@pytest.fixture(scope="module")
def agent(lm_repository: Path) -> Iterator[RunningAgent]:
    with serve(
        lm_repository,
        max_request_bytes=200_000,
        generative={"max_sequences": 16, "prefill_chunk_tokens": 16},
    ) as running:
        yield running


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{agent.url}/v1", api_key="unused", max_retries=0) as c:
        yield c
