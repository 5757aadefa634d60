"""Triton's generate extension on the generative core: one answer, or server-sent events of
``text_output`` deltas; errors in the V2 shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimes.examples import write_example_repository
from tests.agent.server import RunningAgent, serve

MODEL = "tiny-lm"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    root: Path = tmp_path_factory.mktemp("generate")
    write_example_repository(root, models=("tiny-lm",))
    with serve(root) as running:
        yield running


def test_generate_answers_text_and_the_stream_gives_the_same(agent: RunningAgent) -> None:
    body = {"text_input": "The edge device", "parameters": {"max_tokens": 20, "temperature": 0}}
    whole = agent.client.post(f"/v2/models/{MODEL}/generate", json=body)
    assert whole.status_code == 200
    answer = whole.json()
    assert answer["model_name"] == MODEL and answer["model_version"] == "1"
    assert answer["text_output"].isprintable() and answer["text_output"]
    with agent.client.stream(
        "POST", f"/v2/models/{MODEL}/versions/1/generate_stream", json=body
    ) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert len(events) > 5
    assert "".join(e["text_output"] for e in events) == answer["text_output"]


def test_generate_takes_tensorrt_llm_style_fields(agent: RunningAgent) -> None:
    body = {
        "text_input": "a",
        "max_tokens": 5,
        "bad_words": "",
        "stop_words": "",
        "parameters": {"temperature": 0},
    }
    assert agent.client.post(f"/v2/models/{MODEL}/generate", json=body).status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"parameters": {"max_tokens": 2}}, 400, "text_input"),
        ({"text_input": "a", "parameters": {"temperature": 9}}, 400, "parameters.temperature"),
        ({"text_input": "a", "bad_words": ["x"]}, 400, "bad_words"),
        ({"text_input": "a", "what": 1}, 400, "what"),
        ({"text_input": "edge " * 300}, 400, "context window"),
    ],
)
def test_bad_generate_requests_name_the_field(
    agent: RunningAgent, body: dict[str, object], status: int, needle: str
) -> None:
    answer = agent.client.post(f"/v2/models/{MODEL}/generate", json=body)
    assert answer.status_code == status and needle in answer.json()["error"], answer.json()


def test_unknown_model_or_version_is_404(agent: RunningAgent) -> None:
    body = {"text_input": "a"}
    assert agent.client.post("/v2/models/nope/generate", json=body).status_code == 404
    assert (
        agent.client.post(f"/v2/models/{MODEL}/versions/7/generate", json=body).status_code == 404
    )
