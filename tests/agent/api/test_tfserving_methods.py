"""TF Serving's ``:classify`` and ``:regress`` on a real agent: ``mlp`` declares its ``logits``
as the classification output with a labels file, a small regression model (``y = x @ W + 1``)
its ``y``; answers equal ONNX Runtime's own on the same rows; a model without the section, a
bad body and a misdeclared output answer 400 naming why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from common.model_config import ModelConfigError, parse_model_config
from tests.agent.models import REGRESSION_WEIGHTS, write_regression_model
from tests.agent.server import RunningAgent, copy_models, serve

LABELS = [f"class-{i}" for i in range(10)]
MLP = (
    '[tfserving]\nclassify_output = "logits"\nlabels_file = "labels.txt"\n'
    "[tfserving.version_labels]\nstable = 1\ncanary = 2\n"
)


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("tfs"), "mlp", configs={"mlp": MLP})
    (repo / "mlp" / "1" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    write_regression_model(repo, "price", '[tfserving]\nregress_output = "y"\n')
    copy_models(example_repo, repo / "plain", "mlp")  # no [tfserving]: under another name
    (repo / "plain" / "mlp").rename(repo / "undeclared")
    (repo / "plain").rmdir()
    with serve(repo) as running:
        yield running


def test_classify_answers_label_score_pairs_as_onnx_runtime_scores(
    agent: RunningAgent, example_repo: Path
) -> None:
    rows = np.random.default_rng(3).standard_normal((3, 256)).astype(np.float32)
    body = {"examples": [{"input": r.tolist()} for r in rows]}
    resp = agent.client.post("/v1/models/mlp:classify", json=body)
    assert resp.status_code == 200, resp.text
    result = resp.json()["result"]
    session = ort.InferenceSession(str(example_repo / "mlp" / "1" / "model.onnx"))
    (expected,) = session.run(None, {"input": rows})
    assert len(result) == 3
    for pairs, scores in zip(result, expected, strict=True):
        assert [label for label, _ in pairs] == LABELS
        np.testing.assert_allclose([s for _, s in pairs], scores, rtol=1e-5, atol=1e-6)
    versioned = agent.client.post("/v1/models/mlp/versions/1:classify", json=body)
    assert versioned.status_code == 200 and versioned.json() == resp.json()


def test_regress_answers_one_value_per_example_with_the_context_shared(
    agent: RunningAgent,
) -> None:
    rows = [[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]]
    resp = agent.client.post(
        "/v1/models/price:regress", json={"examples": [{"x": r} for r in rows]}
    )
    assert resp.status_code == 200, resp.text
    expected = (np.array(rows, dtype=np.float32) @ REGRESSION_WEIGHTS + 1).ravel()
    np.testing.assert_allclose(resp.json()["result"], expected, rtol=1e-6)
    # a feature every example shares may come once, in the context
    shared = agent.client.post(
        "/v1/models/price:regress", json={"context": {"x": rows[0]}, "examples": [{}]}
    )
    assert shared.status_code == 200, shared.text
    assert shared.json()["result"] == pytest.approx([expected[0]])


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/v1/models/undeclared:classify", {"examples": [{}]}, "tfserving.classify_output"),
        ("/v1/models/mlp:regress", {"examples": [{}]}, "tfserving.regress_output"),
        ("/v1/models/price:regress", {"examples": []}, "examples"),
        ("/v1/models/price:regress", {"examples": [[1, 2, 3, 4]]}, "examples[0]"),
        ("/v1/models/price:regress", {"inputs": {"x": [[1, 2, 3, 4]]}}, "inputs"),
        ("/v1/models/price:regress", {"examples": [{"y": [1, 2, 3, 4]}]}, "examples[0].y"),
        (
            "/v1/models/price:regress",
            {"context": {"x": [1, 2, 3, 4]}, "examples": [{"x": [1, 2, 3, 4]}]},
            "examples[0].x",
        ),
    ],
)
def test_what_cannot_be_answered_is_a_400_naming_the_field(
    agent: RunningAgent, path: str, body: object, named: str
) -> None:
    resp = agent.client.post(path, json=body)
    assert resp.status_code == 400, resp.text
    assert named in resp.text, resp.text


def test_an_unknown_model_is_a_404(agent: RunningAgent) -> None:
    resp = agent.client.post("/v1/models/nope:classify", json={"examples": [{}]})
    assert resp.status_code == 404, resp.text


def test_a_version_label_answers_as_the_version_it_names(agent: RunningAgent) -> None:
    rows = np.random.default_rng(4).standard_normal((2, 256)).astype(np.float32)
    predict = {"instances": rows.tolist()}
    by_label = agent.client.post("/v1/models/mlp/labels/stable:predict", json=predict)
    by_version = agent.client.post("/v1/models/mlp/versions/1:predict", json=predict)
    assert by_label.status_code == 200, by_label.text
    assert by_label.json() == by_version.json()
    examples = {"examples": [{"input": r.tolist()} for r in rows]}
    classified = agent.client.post("/v1/models/mlp/labels/stable:classify", json=examples)
    assert classified.status_code == 200, classified.text
    assert classified.json() == agent.client.post("/v1/models/mlp:classify", json=examples).json()
    status = agent.client.get("/v1/models/mlp/labels/stable")
    assert status.status_code == 200, status.text
    assert [v["version"] for v in status.json()["model_version_status"]] == ["1"]
    metadata = agent.client.get("/v1/models/mlp/labels/stable/metadata")
    assert metadata.status_code == 200, metadata.text
    assert metadata.json()["model_spec"]["version"] == "1"


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/v1/models/mlp/labels/nope:predict", "Unrecognized servable version label: nope"),
        ("/v1/models/mlp/labels/canary:predict", "version 2"),  # labelled, not served here
        ("/v1/models/undeclared/labels/stable:predict", "label: stable"),
    ],
)
def test_a_label_that_names_nothing_served_is_a_404(
    agent: RunningAgent, path: str, named: str
) -> None:
    resp = agent.client.post(path, json={"instances": [[0.0] * 256]})
    assert resp.status_code == 404, resp.text
    assert named in resp.text, resp.text


@pytest.mark.parametrize(
    ("labels", "named"),
    [("1st = 1", "version label '1st'"), ("stable = 0", "version 0 is not >= 1")],
)
def test_a_bad_version_label_is_a_config_error_naming_it(labels: str, named: str) -> None:
    with pytest.raises(ModelConfigError, match=named):
        parse_model_config(f"[tfserving.version_labels]\n{labels}\n", "config.toml")
