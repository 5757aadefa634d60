"""A model the agent cannot serve (a datatype it has no numpy type for, an output that is not a
tensor) fails its own load, visibly, and every other model of the repository still serves."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimes.backends import open_model
from runtimes.base import Placement, Runtime
from runtimes.settings import RuntimeSettings
from tests.agent.models import (
    write_bf16_input_model,
    write_embedding_model,
    write_sequence_output_model,
)
from tests.agent.server import RunningAgent, copy_models, serve

ROW = [0.5] * 256


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("repo"), "mlp")
    # named to load before mlp: a failure must not stop the models after it
    write_bf16_input_model(repo, "a_bf16")
    write_sequence_output_model(repo, "b_seq")
    with serve(repo) as running:
        yield running


def _index(agent: RunningAgent) -> dict[str, dict[str, str]]:
    return {row["name"]: row for row in agent.client.get("/v2/repository/index").json()}


def test_the_other_models_load_and_serve(agent: RunningAgent) -> None:
    assert agent.infer_json("mlp", [ROW]).status_code == 200
    assert agent.client.get("/v2/models/mlp/ready").status_code == 200
    assert _index(agent)["mlp"]["state"] == "READY"


def test_the_server_is_not_ready_while_a_model_that_should_serve_does_not(
    agent: RunningAgent,
) -> None:
    # strict_readiness (the default): ready only when every model of the repository serves
    assert agent.client.get("/v2/health/ready").status_code == 503
    assert agent.client.get("/v2/models/a_bf16/ready").status_code == 503


@pytest.mark.parametrize(
    ("model", "needles"),
    [("a_bf16", ("input 'x'", "BF16")), ("b_seq", ("output 's'", "seq(tensor(float))"))],
)
def test_the_load_error_names_the_tensor_and_its_type(
    agent: RunningAgent, model: str, needles: tuple[str, ...]
) -> None:
    row = _index(agent)[model]
    assert row["state"] == "UNAVAILABLE", row
    for needle in needles:
        assert needle in row["reason"], row


@pytest.mark.parametrize("model", ["a_bf16", "b_seq"])
def test_loading_it_again_answers_the_reason_and_leaves_it_unavailable(
    agent: RunningAgent, model: str
) -> None:
    resp = agent.client.post(f"/v2/repository/models/{model}/load", timeout=20)
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "load_failed" and model in resp.json()["error"]
    assert _index(agent)[model]["state"] == "UNAVAILABLE"
    assert agent.infer_json("mlp", [ROW]).status_code == 200


def test_without_strict_readiness_the_server_is_ready_with_what_serves(
    example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    write_bf16_input_model(repo, "a_bf16")
    with serve(repo, strict_readiness=False) as agent:
        assert agent.client.get("/v2/health/ready").status_code == 200
        assert _index(agent)["a_bf16"]["state"] == "UNAVAILABLE"


def test_an_unexpected_error_fails_only_its_model_and_is_logged_with_its_traceback(
    example_repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    write_embedding_model(repo, "a_broken")

    def factory(model_file: Path, placement: Placement, settings: RuntimeSettings) -> Runtime:
        if "a_broken" in model_file.parts:
            raise KeyError("a bug in a backend")  # not an error of the runtimes tree
        return open_model(model_file, placement, settings)

    with caplog.at_level(logging.ERROR, logger="edgefleet.agent.models"):
        with serve(repo, runtime_factory=factory) as agent:
            assert agent.infer_json("mlp", [ROW]).status_code == 200
            row = _index(agent)["a_broken"]
            assert row["state"] == "UNAVAILABLE" and "a bug in a backend" in row["reason"], row
            resp = agent.client.post("/v2/repository/models/a_broken/load", timeout=20)
            assert resp.status_code == 400 and "a bug in a backend" in resp.json()["error"]
    failures = [r for r in caplog.records if r.getMessage() == "version failed to load"]
    assert failures and all(r.exc_info is not None for r in failures)
