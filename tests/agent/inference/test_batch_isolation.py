"""A request whose data makes the model fail, batched with valid ones, fails alone: the batch is
run again one request at a time, so its neighbours get their outputs (over the wire, with real
ONNX models whose failures depend on the data)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.agent.models import embedding_table, write_embedding_model, write_upper_model
from tests.agent.server import RunningAgent, serve

# Four requests fill a batch at once; the long delay makes sure they wait for each other.
BATCHING = "[batching]\nmax_batch_size = 4\nmax_queue_delay_us = 5_000_000\n"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("repo")
    write_embedding_model(repo, config=BATCHING)
    write_upper_model(repo)
    (repo / "upper" / "config.toml").write_text(BATCHING)
    with serve(repo) as running:
        yield running


def _lookup(agent: RunningAgent, index: int) -> httpx.Response:
    body = {"inputs": [{"name": "index", "shape": [1], "datatype": "INT64", "data": [index]}]}
    return agent.client.post("/v2/models/emb/infer", json=body)


def _upper(agent: RunningAgent, text: bytes) -> httpx.Response:
    # binary: only the binary extension can carry a string that is not UTF-8
    binary = {
        "name": "text",
        "shape": [1],
        "datatype": "BYTES",
        "parameters": {"binary_data_size": 4 + len(text)},
    }
    head = json.dumps({"inputs": [binary], "parameters": {"binary_data_output": False}}).encode()
    return agent.client.post(
        "/v2/models/upper/infer",
        content=head + len(text).to_bytes(4, "little") + text,
        headers={"Inference-Header-Content-Length": str(len(head))},
    )


def _reruns(agent: RunningAgent, model: str) -> float:
    for line in agent.client.get("/metrics").text.splitlines():
        if line.startswith(f'edgefleet_batch_reruns_total{{model="{model}"'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no edgefleet_batch_reruns_total series for {model}")


def _batch_sizes(agent: RunningAgent, model: str) -> set[int]:
    stats = agent.client.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
    return {b["batch_size"] for b in stats["batch_stats"]}


def test_an_index_out_of_range_fails_only_its_own_request(agent: RunningAgent) -> None:
    indices = [1, 99, 3, 7]  # the table has 10 rows
    reruns = _reruns(agent, "emb")
    with ThreadPoolExecutor(len(indices)) as pool:
        responses = list(pool.map(lambda i: _lookup(agent, i), indices))
    assert 4 in _batch_sizes(agent, "emb"), "the four requests did not share a batch"
    bad = responses[1]
    assert bad.status_code == 500 and bad.json()["code"] == "inference_failed", bad.text
    assert "indices element out of data bounds" in bad.json()["error"]
    assert _reruns(agent, "emb") == reruns + 1
    table = embedding_table()
    for index, resp in zip(indices, responses, strict=True):
        if index == 99:
            continue
        assert resp.status_code == 200, resp.text
        (output,) = resp.json()["outputs"]
        assert output["data"] == table[index].tolist()


def test_a_string_that_is_not_utf8_fails_only_its_own_request(agent: RunningAgent) -> None:
    texts = [b"edge", b"\xff\xfe", b"fleet", b"agent"]
    with ThreadPoolExecutor(len(texts)) as pool:
        responses = list(pool.map(lambda t: _upper(agent, t), texts))
    assert 4 in _batch_sizes(agent, "upper"), "the four requests did not share a batch"
    bad = responses[1]
    assert bad.status_code == 400 and "must be UTF-8" in bad.json()["error"], bad.text
    for text, resp in zip(texts, responses, strict=True):
        if text == b"\xff\xfe":
            continue
        assert resp.status_code == 200, resp.text
        assert resp.json()["outputs"][0]["data"] == [text.decode().upper()]


def test_valid_batches_still_run_as_one(agent: RunningAgent) -> None:
    reruns = _reruns(agent, "emb")
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda i: _lookup(agent, i), [0, 2, 4, 6]))
    table = embedding_table()
    outputs = [np.array(r.json()["outputs"][0]["data"]) for r in responses]
    np.testing.assert_array_equal(np.stack(outputs), table[[0, 2, 4, 6]])
    assert _reruns(agent, "emb") == reruns
    assert agent.client.get("/v2/health/ready").status_code == 200
