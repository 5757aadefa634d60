"""Models whose dynamic dimensions are not all a batch load and serve over the wire: one whose
first output dimension is dynamic but is not the batch (ONNX NonZero) runs its requests one at
a time, and one whose image size is dynamic (a Conv) serves without a golden sample although
zeros of size 1 cannot warm it."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.agent.models import write_dynamic_conv_model, write_nonzero_model
from tests.agent.server import RunningAgent, serve


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("repo")
    write_nonzero_model(repo)
    write_dynamic_conv_model(repo)
    with serve(repo) as running:
        yield running


def _hits(agent: RunningAgent, rows: list[list[float]]) -> httpx.Response:
    data = [v for row in rows for v in row]
    body = {"inputs": [{"name": "x", "shape": [len(rows), 4], "datatype": "FP32", "data": data}]}
    return agent.client.post("/v2/models/hits/infer", json=body)


def test_a_model_whose_output_rows_are_not_the_batch_serves_each_request_whole(
    agent: RunningAgent,
) -> None:
    metadata = agent.client.get("/v2/models/hits").json()
    assert metadata["parameters"]["batched"] is False, metadata
    requests = [[[1, 0, 2, 0]], [[0, 0, 0, 3], [4, 0, 0, 0]], [[0, 0, 0, 0]], [[5, 6, 7, 8]]]
    with ThreadPoolExecutor(len(requests)) as pool:
        responses = list(pool.map(lambda rows: _hits(agent, rows), requests))
    for rows, resp in zip(requests, responses, strict=True):
        assert resp.status_code == 200, resp.text
        (output,) = resp.json()["outputs"]
        expected = np.argwhere(np.array(rows) != 0)
        assert output["shape"] == list(expected.shape)
        assert output["data"] == expected.ravel().tolist()


def test_a_dynamic_resolution_model_serves_without_a_golden_sample(agent: RunningAgent) -> None:
    index = agent.client.post("/v2/repository/index", json={}).json()
    assert {"name": "conv", "version": "1", "state": "READY"}.items() <= next(
        m for m in index if m["name"] == "conv"
    ).items(), index
    image = np.arange(2 * 5 * 6, dtype=np.float32).reshape(2, 1, 5, 6)
    data = image.ravel().tolist()
    tensor = {"name": "image", "shape": list(image.shape), "datatype": "FP32", "data": data}
    body = {"inputs": [tensor]}
    resp = agent.client.post("/v2/models/conv/infer", json=body)
    assert resp.status_code == 200, resp.text
    (output,) = resp.json()["outputs"]
    windows = np.lib.stride_tricks.sliding_window_view(image, (3, 3), axis=(2, 3))
    expected = windows.sum(axis=(-2, -1))
    assert output["shape"] == [2, 1, 3, 4]
    np.testing.assert_allclose(np.array(output["data"]).reshape(2, 1, 3, 4), expected)


def test_zeros_that_fail_a_model_of_fixed_dimensions_still_fail_its_load(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The leniency is for dynamic dimensions only: the same convolution with a fixed 1x1
    image cannot run at all, and stays UNAVAILABLE with the reason."""
    import onnx

    repo = tmp_path_factory.mktemp("fixed")
    version_dir = write_dynamic_conv_model(repo)
    model = onnx.load(version_dir / "model.onnx")
    for dim in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        dim.dim_value = 1  # H and W
    onnx.save(model, version_dir / "model.onnx")
    with serve(repo, wait_ready=False) as running:
        index = running.client.post("/v2/repository/index", json={}).json()
    (conv,) = index
    assert conv["state"] == "UNAVAILABLE", conv
    assert "warm-up with zeros failed" in conv["reason"]
