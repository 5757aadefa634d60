"""Ground truth over REST: a model with ``[ground_truth]`` keeps its predictions by request
id, an app posts outcomes for them, and what could not be joined is counted, not refused;
bad bodies are 4xx naming the field."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.agent.server import RunningAgent, copy_models, serve

ROW = [0.5] * 256
CONFIG = '[ground_truth]\ntask = "classification"\n'


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("repo")
    copy_models(example_repo, repo, "mlp", configs={"mlp": CONFIG})
    # the same model without [ground_truth]: nothing of it is kept
    shutil.copytree(repo / "mlp", repo / "plain")
    (repo / "plain" / "config.toml").unlink()
    with serve(repo, ground_truth={"max_predictions": 50, "max_outcomes_per_post": 100}) as running:
        yield running


def predict(
    agent: RunningAgent, model: str, rows: list[list[float]], **extra: Any
) -> tuple[str, list[int]]:
    answer = agent.infer_json(model, rows, **extra)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    (out,) = doc["outputs"]
    top = np.asarray(out["data"]).reshape(out["shape"][0], -1).argmax(axis=1)
    return doc["id"], [int(t) for t in top]


def feedback(agent: RunningAgent, model: str, body: Any) -> Any:
    return agent.client.post(f"/v2/models/{model}/feedback", json=body)


def test_outcomes_join_by_the_client_id_and_by_the_agents(agent: RunningAgent) -> None:
    rng = np.random.default_rng(0)
    mine, (top,) = predict(agent, "mlp", [rng.normal(size=256).tolist()], id="order-17")
    assert mine == "order-17"
    assigned, tops = predict(agent, "mlp", rng.normal(size=(3, 256)).tolist())
    assert assigned  # the agent's own id, returned in the response
    outcomes = [
        {"id": "order-17", "label": top},
        {"id": assigned, "labels": [tops[0], tops[1] + 1, tops[2]]},
        {"id": "never-seen", "label": 1},
    ]
    answer = feedback(agent, "mlp", {"outcomes": outcomes})
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    assert (doc["received"], doc["joined"], doc["unknown"], doc["expired"]) == (3, 2, 1, 0)
    again = feedback(agent, "mlp", {"outcomes": outcomes[:1]}).json()
    assert (again["joined"], again["unknown"]) == (0, 1)  # an outcome joins once


def test_a_model_without_ground_truth_keeps_nothing(agent: RunningAgent) -> None:
    request_id, (top,) = predict(agent, "plain", [ROW], id="plain-1")
    doc = feedback(agent, "plain", {"outcomes": [{"id": request_id, "label": top}]}).json()
    assert (doc["joined"], doc["unknown"]) == (0, 1)


def test_labels_that_do_not_fit_the_prediction_are_counted(agent: RunningAgent) -> None:
    request_id, _ = predict(agent, "mlp", [ROW, ROW], id="two-rows")
    outcomes = [{"id": request_id, "label": 1}, {"id": request_id, "labels": [0.5, 1]}]
    doc = feedback(agent, "mlp", {"outcomes": outcomes}).json()
    assert (doc["joined"], doc["mismatched"]) == (0, 2)
    doc = feedback(agent, "mlp", {"outcomes": [{"id": request_id, "labels": [1, 2]}]}).json()
    assert doc["joined"] == 1


def test_old_predictions_make_room_for_new_ones(agent: RunningAgent) -> None:
    first, _ = predict(agent, "mlp", [ROW], id="oldest")
    for i in range(50):  # max_predictions
        predict(agent, "mlp", [ROW], id=f"newer-{i}")
    doc = feedback(agent, "mlp", {"outcomes": [{"id": first, "label": 0}]}).json()
    assert doc["unknown"] == 1
    assert len(agent.state.service.predictions or ()) == 50


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([1, 2], "body"),
        ({"outcome": []}, "outcome"),
        ({"outcomes": []}, "outcomes"),
        ({"outcomes": "x"}, "outcomes"),
        ({"outcomes": [3]}, "outcomes[0]"),
        ({"outcomes": [{"label": 1}]}, "outcomes[0].id"),
        ({"outcomes": [{"id": "", "label": 1}]}, "outcomes[0].id"),
        ({"outcomes": [{"id": "a" * 257, "label": 1}]}, "outcomes[0].id"),
        ({"outcomes": [{"id": "a"}]}, "outcomes[0].label"),
        ({"outcomes": [{"id": "a", "label": 1, "labels": [1]}]}, "outcomes[0].label"),
        ({"outcomes": [{"id": "a", "label": "cat"}]}, "outcomes[0].label"),
        ({"outcomes": [{"id": "a", "label": True}]}, "outcomes[0].label"),
        ({"outcomes": [{"id": "a", "labels": []}]}, "outcomes[0].labels"),
        ({"outcomes": [{"id": "a", "label": 1, "why": "x"}]}, "outcomes[0].why"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(agent: RunningAgent, body: Any, field: str) -> None:
    answer = feedback(agent, "mlp", body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith(f"{field}:"), answer.text


def test_not_json_too_many_and_unknown_model(agent: RunningAgent) -> None:
    answer = agent.client.post("/v2/models/mlp/feedback", content=b"{not json")
    assert answer.status_code == 400 and answer.json()["error"].startswith("body:")
    many = {"outcomes": [{"id": f"r{i}", "label": 0} for i in range(101)]}
    answer = feedback(agent, "mlp", many)
    assert answer.status_code == 413, answer.text
    assert "max_outcomes_per_post" in answer.json()["error"]
    assert feedback(agent, "nope", {"outcomes": [{"id": "a", "label": 1}]}).status_code == 404
