"""Overload, bounded: a real agent process on 127.0.0.1 driven far past what it can serve.

One run, four phases on the same process, every claim a ratio between phases of that run (the
machine is shared, so absolute times mean nothing):

1. unloaded: one connection; the median latency of an answer;
2. moderate: as many connections as the agent admits; its memory (RSS);
3. overload: 384 connections for 10 s against 4 admitted at once (clients wait out each
   Retry-After, with jitter, and send again);
4. recovery: one connection again, at once.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from tests.agent.process import AgentProcess, agent_process
from tests.agent.server import copy_models, wait_until
from tests.hardening.loadclient import load, post
from tests.rss import PeakRss

ADMITTED = 4
"""max_concurrent_requests: requests in flight at once; the rest get 503 at once."""
ROWS = 64
"""Rows per request: one request is one batch of real work (~10 ms of MLP on one core)."""
OVERLOAD = 384


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    config = f"instances = 1\n[batching]\nmax_batch_size = {ROWS}\nmax_queue_delay_us = 0\n"
    repo = copy_models(
        example_repo, tmp_path_factory.mktemp("overload"), "mlp", configs={"mlp": config}
    )
    env = {
        "EDGEFLEET_AGENT_MAX_CONCURRENT_REQUESTS": str(ADMITTED),
        "EDGEFLEET_AGENT_ACCESS_LOG": "false",
    }
    with agent_process("--model-repository", str(repo), "--port", "0", env=env) as running:
        wait_until(
            lambda: httpx.get(f"{running.address}/v2/health/ready").status_code == 200,
            what="the model to load",
        )
        yield running


def infer_request() -> bytes:
    """A binary-extension request of ROWS rows: small to parse, real work to run."""
    raw = np.random.default_rng(0).standard_normal((ROWS, 256)).astype(np.float32).tobytes()
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [ROWS, 256],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    return post(
        "/v2/models/mlp/infer", head + raw, {"Inference-Header-Content-Length": str(len(head))}
    )


@pytest.mark.slow
def test_overload_is_refused_fast_and_the_agent_recovers(agent: AgentProcess) -> None:
    request = infer_request()
    url, pid = agent.address, agent.proc.pid

    unloaded = asyncio.run(load(url, request, 1, 2.0))
    assert unloaded.count(200) == len(unloaded.statuses) > 10 and not unloaded.errors
    base_s = unloaded.median_s(200)

    with PeakRss(pid, interval_s=0.1) as moderate_rss:
        moderate = asyncio.run(load(url, request, ADMITTED, 3.0))
    assert set(moderate.statuses) == {200}, (
        f"refused at the admitted concurrency: {moderate.statuses}"
    )

    with PeakRss(pid, interval_s=0.1) as overload_rss:
        heavy = asyncio.run(load(url, request, OVERLOAD, 10.0))
    recovery = asyncio.run(load(url, request, 1, 2.0))

    ok, refused = heavy.count(200), heavy.count(503)
    report = (
        f"unloaded p50 {base_s * 1e3:.1f} ms; overload: {ok} admitted (p50 "
        f"{heavy.median_s(200) * 1e3:.1f} ms), {refused} refused (p50 "
        f"{heavy.median_s(503) * 1e3:.1f} ms), {heavy.errors} errors; RSS moderate "
        f"{moderate_rss.peak >> 20} MiB, overload peak {overload_rss.peak >> 20} MiB; recovery "
        f"p50 {recovery.median_s(200) * 1e3:.1f} ms"
    )
    print(report)
    # Only admitted answers and refusals, every refusal with its Retry-After; nothing dropped.
    assert set(heavy.statuses) == {200, 503} and heavy.errors == 0, report
    assert all(r for s, r in zip(heavy.statuses, heavy.retry_after, strict=True) if s == 503)
    # Far past capacity (the clients wait out each Retry-After, so refusals come about once a
    # second and a half per connection): many refused, and the admitted keep being served.
    assert refused > 2 * OVERLOAD and ok > 0, report
    # Refusals are fast next to real work, in the same run.
    assert heavy.median_s(503) < 0.5 * heavy.median_s(200), report
    # Admitted requests keep their latency: a bounded queue of ADMITTED requests, not 384.
    assert heavy.median_s(200) < 8 * ADMITTED * base_s, report
    # Memory stays bounded: 384 connections cost little next to moderate load.
    assert overload_rss.peak < 1.5 * moderate_rss.peak, report
    # Recovery is immediate: the first request after the surge is served, at unloaded speed.
    assert recovery.statuses[0] == 200 and set(recovery.statuses) == {200}, report
    assert statistics.median(recovery.latencies_s) < 5 * base_s, report
