"""Batching and scheduling on a real agent: concurrent requests batch, big ones split, a full
queue sheds load, deadlines expire, priorities order, disconnected clients are dropped.

Tests named "gated" hold batches inside the runtime with a fake that wraps the real
ONNX Runtime session (tests/agent/fakes.py), so the queue state is known, not guessed.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from runtimes.backends import open_model
from runtimes.base import Placement
from tests.agent.fakes import Gate, gated_factory
from tests.agent.server import RunningAgent, copy_models, serve, wait_until


def rows_marked(*marks: float, n_rows: int = 1) -> np.ndarray:
    """Rows whose first value identifies the request (the gate records it)."""
    x = np.zeros((len(marks) * n_rows, 256), np.float32)
    x[:, 0] = np.repeat(marks, n_rows)
    return x


@contextmanager
def agent_with(
    example_repo: Path, tmp_path: Path, config: str, gate: Gate | None = None
) -> Iterator[RunningAgent]:
    # one instance and the batch size as written, unless a test says otherwise: what the gate
    # holds and the counts below assume (by default the agent picks both on the device)
    config = ("" if "instances" in config else "instances = 1\n") + config
    config = config.replace("[batching]\n", "[batching]\ntune = false\n", 1)
    repo = copy_models(example_repo, tmp_path / "repo", "mlp", configs={"mlp": config})
    factory = gated_factory(gate) if gate is not None else open_model
    with serve(repo, runtime_factory=factory) as agent:
        yield agent


def pending(agent: RunningAgent) -> int:
    return agent.state.manager.resolve("mlp").batcher.pending


def post(agent: RunningAgent, x: np.ndarray, **parameters: object) -> httpx.Response:
    data = x.ravel().tolist()
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": data}
    body: dict[str, object] = {"inputs": [tensor]}
    if parameters:
        body["parameters"] = parameters
    with httpx.Client(base_url=agent.url, timeout=60) as client:  # one connection per caller
        return client.post("/v2/models/mlp/infer", json=body)


def logits(resp: httpx.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    out = resp.json()["outputs"][0]
    return np.array(out["data"], np.float32).reshape(out["shape"])


@pytest.fixture(scope="module")
def reference(example_repo: Path) -> Callable[[np.ndarray], np.ndarray]:
    runtime = open_model(
        example_repo / "mlp/1/model.onnx",
        Placement(runtime="onnxruntime", providers=("CPUExecutionProvider",)),
    )
    return lambda x: runtime.infer({"input": x})["logits"]


def test_gated_concurrent_requests_share_a_batch_and_get_their_own_rows(
    example_repo: Path, tmp_path: Path, reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    gate = Gate(closed=False)
    # balancing off: it would split the 15 waiting requests into two batches for a pipeline
    config = "[batching]\nmax_batch_size = 32\nbalance_batches = false\n"
    with agent_with(example_repo, tmp_path, config, gate) as agent:
        gate.close()
        rng = np.random.default_rng(3)
        inputs = [rng.standard_normal((1 + i % 3, 256)).astype(np.float32) for i in range(16)]
        with ThreadPoolExecutor(16) as pool:
            first = pool.submit(post, agent, inputs[0])
            gate.wait_entered()  # request 0 runs alone and holds the only instance
            rest = [pool.submit(post, agent, x) for x in inputs[1:]]
            wait_until(lambda: pending(agent) == 15, what="15 queued requests")
            gate.open()
            results = [first.result(), *(f.result() for f in rest)]
        for x, resp in zip(inputs, results, strict=True):
            np.testing.assert_allclose(logits(resp), reference(x), rtol=1e-5, atol=1e-5)
        stats = agent.client.get("/v2/models/mlp/stats").json()["model_stats"][0]
        # warm-up ran 1 batch of 8 golden rows; then request 0 alone; then the 15 others at once
        sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
        rows_rest = sum(len(x) for x in inputs[1:])
        assert sizes.get(rows_rest) == 1, sizes
        assert stats["execution_count"] == 2
        metrics = agent.client.get("/metrics").text
        assert 'edgefleet_batch_executions_total{model="mlp",version="1"} 2.0' in metrics


def test_concurrent_clients_are_batched_without_a_gate(
    example_repo: Path, tmp_path: Path, reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    with agent_with(
        example_repo, tmp_path, "[batching]\nmax_batch_size = 64\nmax_queue_delay_us = 20000\n"
    ) as agent:
        xs = [
            np.random.default_rng(i).standard_normal((1, 256)).astype(np.float32) for i in range(48)
        ]
        with ThreadPoolExecutor(48) as pool:
            results = list(pool.map(lambda x: post(agent, x), xs))
        for x, resp in zip(xs, results, strict=True):
            np.testing.assert_allclose(logits(resp), reference(x), rtol=1e-5, atol=1e-5)
        stats = agent.client.get("/v2/models/mlp/stats").json()["model_stats"][0]
        assert stats["inference_count"] == 48
        assert stats["execution_count"] < 48
        assert max(b["batch_size"] for b in stats["batch_stats"]) > 1


def test_request_larger_than_a_batch_is_split_and_reassembled(
    example_repo: Path, tmp_path: Path, reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    with agent_with(example_repo, tmp_path, "[batching]\nmax_batch_size = 4\n") as agent:
        x = np.random.default_rng(9).standard_normal((10, 256)).astype(np.float32)
        np.testing.assert_allclose(logits(post(agent, x)), reference(x), rtol=1e-5, atol=1e-5)
        stats = agent.client.get("/v2/models/mlp/stats").json()["model_stats"][0]
        assert stats["inference_count"] == 10 and stats["execution_count"] == 3
        assert {b["batch_size"] for b in stats["batch_stats"]} == {2, 4}


def test_gated_full_queue_answers_503_with_retry_after_at_once(
    example_repo: Path, tmp_path: Path
) -> None:
    gate = Gate(closed=False)
    config = "[batching]\nmax_batch_size = 1\nmax_queue_size = 2\n"
    with agent_with(example_repo, tmp_path, config, gate) as agent, ThreadPoolExecutor(4) as pool:
        gate.close()
        held = pool.submit(post, agent, rows_marked(1))
        gate.wait_entered()
        queued = []
        for n, mark in enumerate((2, 3), 1):
            queued.append(pool.submit(post, agent, rows_marked(mark)))
            wait_until(lambda n=n: pending(agent) == n, what="a full queue")
        shed = post(agent, rows_marked(4))  # answered while the gate is still closed
        assert shed.status_code == 503
        assert shed.json()["code"] == "overloaded" and "queue is full" in shed.json()["error"]
        assert int(shed.headers["retry-after"]) >= 1
        gate.open()
        assert all(f.result().status_code == 200 for f in [held, *queued])
        assert gate.first_values() == [1.0, 2.0, 3.0]  # the shed request never ran


def test_gated_deadline_in_queue_times_out_and_is_not_run(
    example_repo: Path, tmp_path: Path
) -> None:
    gate = Gate(closed=False)
    with (
        agent_with(example_repo, tmp_path, "[batching]\nmax_batch_size = 1\n", gate) as agent,
        ThreadPoolExecutor(2) as pool,
    ):
        gate.close()
        held = pool.submit(post, agent, rows_marked(1))
        gate.wait_entered()
        late = post(agent, rows_marked(2), timeout=50_000)  # 50 ms, answered with the gate closed
        assert late.status_code == 504
        assert (
            late.json()["code"] == "deadline_exceeded" and "it was not run" in late.json()["error"]
        )
        gate.open()
        assert held.result().status_code == 200
        assert gate.first_values() == [1.0]


def test_gated_default_timeout_from_config(example_repo: Path, tmp_path: Path) -> None:
    gate = Gate(closed=False)
    config = "[batching]\nmax_batch_size = 1\ndefault_timeout_us = 30000\n"
    with agent_with(example_repo, tmp_path, config, gate) as agent, ThreadPoolExecutor(2) as pool:
        gate.close()
        held = pool.submit(post, agent, rows_marked(1))
        gate.wait_entered()
        assert post(agent, rows_marked(2)).status_code == 504
        gate.open()
        assert held.result().status_code == 200


def test_gated_higher_priority_runs_first(example_repo: Path, tmp_path: Path) -> None:
    gate = Gate(closed=False)
    config = "[batching]\nmax_batch_size = 1\npriority_levels = 2\n"
    with agent_with(example_repo, tmp_path, config, gate) as agent, ThreadPoolExecutor(4) as pool:
        gate.close()
        futures = [pool.submit(post, agent, rows_marked(1))]
        gate.wait_entered()
        for queued, (mark, priority) in enumerate(((2, 2), (3, 2), (4, 1)), 1):
            futures.append(pool.submit(post, agent, rows_marked(mark), priority=priority))
            wait_until(lambda n=queued: pending(agent) == n, what="queued")
        gate.open()
        assert all(f.result().status_code == 200 for f in futures)
        assert gate.first_values() == [1.0, 4.0, 2.0, 3.0]


def test_gated_disconnected_client_is_dropped_from_the_queue(
    example_repo: Path, tmp_path: Path
) -> None:
    gate = Gate(closed=False)
    with (
        agent_with(example_repo, tmp_path, "[batching]\nmax_batch_size = 1\n", gate) as agent,
        ThreadPoolExecutor(1) as pool,
    ):
        gate.close()
        held = pool.submit(post, agent, rows_marked(1))
        gate.wait_entered()
        x = rows_marked(2)
        tensor = {"name": "input", "shape": [1, 256], "datatype": "FP32", "data": x.ravel()}
        body = orjson.dumps({"inputs": [tensor]}, option=orjson.OPT_SERIALIZE_NUMPY)
        head = [
            "POST /v2/models/mlp/infer HTTP/1.1",
            "Host: x",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
        ]
        head_bytes = "".join(f"{line}\r\n" for line in head).encode() + b"\r\n"
        host, port = agent.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(head_bytes + body)
            wait_until(lambda: pending(agent) == 1, what="the request to queue")
        wait_until(lambda: pending(agent) == 0, what="the dropped request to leave the queue")
        gate.open()
        assert held.result().status_code == 200
        assert gate.first_values() == [1.0]


@pytest.mark.parametrize("preserve", [True, False])
def test_gated_preserve_ordering_with_two_instances(
    example_repo: Path, tmp_path: Path, preserve: bool
) -> None:
    """A is held inside one instance while B runs on the other: B's answer overtakes A's
    unless preserve_ordering holds it back until A's is out."""
    gate = Gate(closed=False)
    gate.held_marks = {1.0}
    config = f"instances = 2\n[batching]\nmax_batch_size = 1\npreserve_ordering = {str(preserve).lower()}\n"
    with agent_with(example_repo, tmp_path, config, gate) as agent, ThreadPoolExecutor(2) as pool:
        a = pool.submit(post, agent, rows_marked(1))
        wait_until(lambda: agent.state.manager.resolve("mlp").batcher.running == 1, what="A to run")
        b = pool.submit(post, agent, rows_marked(2))
        wait_until(lambda: 2.0 in gate.first_values(), what="B to be computed")
        if preserve:
            with pytest.raises(FutureTimeout):
                b.result(timeout=0.3)  # computed, but not answered before A
        else:
            assert b.result(timeout=30).status_code == 200  # answered while A is still held
            assert not a.done()
        gate.release()
        assert a.result().status_code == 200 and b.result().status_code == 200


def test_unbatched_model_runs_requests_one_by_one(example_repo: Path, tmp_path: Path) -> None:
    with agent_with(example_repo, tmp_path, "[batching]\nmax_batch_size = 0\n") as agent:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: post(agent, rows_marked(i, n_rows=2)), range(8)))
        assert all(r.status_code == 200 for r in results)
        stats = agent.client.get("/v2/models/mlp/stats").json()["model_stats"][0]
        assert stats["execution_count"] == 8 and {
            b["batch_size"] for b in stats["batch_stats"]
        } == {2}


@pytest.mark.slow
def test_many_requests_in_parallel_all_succeed_within_bounded_time(
    example_repo: Path, tmp_path: Path
) -> None:
    """Not a speed test: a soak of 400 requests from 32 clients, every answer correct."""
    with agent_with(example_repo, tmp_path, "[batching]\nmax_batch_size = 32\n") as agent:
        started = time.monotonic()
        with ThreadPoolExecutor(32) as pool:
            codes = list(
                pool.map(
                    lambda i: post(agent, rows_marked(float(i) / 1000)).status_code, range(400)
                )
            )
        assert codes == [200] * 400
        assert time.monotonic() - started < 120
