"""Infer requests with a body of 64 KiB or more are answered from the connection's callbacks,
without an ASGI task (``agent.api.fastpath.InferFastPath.start``): the same answers, errors and
cancellations as the task path that smaller bodies take. (Shutdown: tests/hardening/test_limits.)"""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from agent.http.limits import BUFFERED_BODY_BYTES
from tests.agent.fakes import Gate
from tests.agent.inference.test_scheduling import (
    agent_with,
    logits,
    pending,
    post,
    reference,
    rows_marked,
)
from tests.agent.server import wait_until

__all__ = ["reference"]  # the fixture, imported for the tests below

ROWS = 80  # a JSON body of about 80 KB


def _doc(x: np.ndarray) -> dict[str, object]:
    data = x.ravel().tolist()
    return {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": data}]}


def test_a_large_request_is_answered_as_a_small_one_is(
    example_repo: Path, tmp_path: Path, reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    x = np.random.default_rng(0).standard_normal((ROWS, 256)).astype(np.float32).round(3)
    with agent_with(example_repo, tmp_path, "") as agent:
        resp = post(agent, x)
        small = post(agent, x[:1])
    assert len(resp.request.content) >= BUFFERED_BODY_BYTES > len(small.request.content)
    np.testing.assert_allclose(logits(resp), reference(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits(small), logits(resp)[:1], rtol=1e-5, atol=1e-5)
    for answer in (resp, small):  # the request context's headers, on both paths
        assert answer.headers["x-request-id"] and answer.headers["traceparent"].startswith("00-")
        assert "compute;dur=" in answer.headers["server-timing"]


def test_a_large_request_at_fault_is_a_400_naming_the_field(
    example_repo: Path, tmp_path: Path
) -> None:
    doc = _doc(np.zeros((ROWS, 256), np.float32))
    doc["inputs"][0]["shape"] = [ROWS, 255]  # type: ignore[index]
    with agent_with(example_repo, tmp_path, "") as agent:
        resp = agent.client.post("/v2/models/mlp/infer", json=doc)
        assert len(resp.request.content) >= BUFFERED_BODY_BYTES
        assert resp.status_code == 400, resp.text
        assert "inputs[0]" in resp.json()["error"]
        # the connection serves the next request
        assert agent.infer_json("mlp", [[0.5] * 256]).status_code == 200


def test_a_large_compressed_body_is_inflated(example_repo: Path, tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((4 * ROWS, 256)).astype(np.float32).round(3)
    body = gzip.compress(json.dumps(_doc(x)).encode())
    assert len(body) >= BUFFERED_BODY_BYTES
    with agent_with(example_repo, tmp_path, "") as agent:
        resp = agent.client.post(
            "/v2/models/mlp/infer",
            content=body,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
        plain = post(agent, x)
    np.testing.assert_array_equal(logits(resp), logits(plain))


def test_gated_a_large_request_whose_client_left_is_dropped_unrun(
    example_repo: Path, tmp_path: Path
) -> None:
    gate = Gate(closed=False)
    config = "[batching]\nmax_batch_size = 128\n"
    with agent_with(example_repo, tmp_path, config, gate) as agent, ThreadPoolExecutor(1) as pool:
        gate.close()
        held = pool.submit(post, agent, rows_marked(1))
        gate.wait_entered()
        body = json.dumps(_doc(rows_marked(2, n_rows=ROWS))).encode()
        host, port = agent.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            head = (
                "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
            wait_until(lambda: pending(agent) == 1, what="the large request to be queued")
        wait_until(lambda: pending(agent) == 0, what="the request of a client gone to be dropped")
        gate.open()
        assert held.result().status_code == 200
        assert gate.first_values() == [1.0]  # the large request never ran
        resp = post(agent, rows_marked(3, n_rows=ROWS))  # and the agent serves on
    assert isinstance(resp, httpx.Response) and resp.status_code == 200
