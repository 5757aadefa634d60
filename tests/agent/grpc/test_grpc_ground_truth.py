"""Predictions answered over gRPC are kept under the request's id, and their outcomes,
posted over REST (the KServe service has no method for them), join them."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.agent.grpc.conftest import GrpcAgent, grpc_settings
from tests.agent.server import copy_models, serve

CONFIG = '[ground_truth]\ntask = "classification"\n'


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcAgent]:
    repo = copy_models(
        example_repo, tmp_path_factory.mktemp("repo"), "mlp", configs={"mlp": CONFIG}
    )
    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # a socket path has 108 bytes
        uds = Path(short) / "agent.sock"
        grpc = grpc_settings(uds)
        with serve(repo, grpc=grpc) as running:
            yield GrpcAgent(running, f"127.0.0.1:{grpc['port']}", uds)


def test_a_grpc_prediction_joins_an_outcome_posted_over_rest(agent: GrpcAgent) -> None:
    x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    with agent.client() as client:
        result = client.infer("mlp", [tensor], request_id="grpc-7")
    top = result.as_numpy("logits").reshape(2, -1).argmax(axis=1)
    outcomes = [{"id": "grpc-7", "labels": [int(top[0]), int(top[1]) + 1]}]
    answer = agent.rest.client.post("/v2/models/mlp/feedback", json={"outcomes": outcomes})
    assert answer.status_code == 200, answer.text
    assert (answer.json()["joined"], answer.json()["unknown"]) == (1, 0)
