"""The benchmark's load generator (talks HTTP/1.1 correctly, counts honestly, aims at loopback
only) and its A/B of agent variants against raw ONNX Runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.serving.ab import Variant, compare
from benchmarks.serving.calls import count_calls
from benchmarks.serving.loadgen import build_request
from benchmarks.serving.serving import binary_request
from tests.agent.server import copy_models, serve


def test_loadgen_drives_a_real_agent_and_reports(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    body, headers = binary_request(np.zeros((1, 256), np.float32))
    (tmp_path / "body.bin").write_bytes(body)
    with serve(repo) as agent:
        url = f"{agent.url}/v2/models/mlp/infer"
        args = [sys.executable, "-m", "benchmarks.serving.loadgen", "--url", url]
        args += ["--body", str(tmp_path / "body.bin"), "-c", "4", "-d", "1"]
        for h in headers:
            args += ["--header", h]
        out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60)
        report = json.loads(out.stdout)
        stats = agent.client.get("/v2/models/mlp/stats").json()["model_stats"][0]
    assert report["statuses"] == {"200": report["requests"]} and report["errors"] == 0
    assert report["requests"] == stats["inference_stats"]["success"]["count"]
    assert 0 < report["p50_s"] <= report["p95_s"] <= report["p99_s"]
    assert report["client_cpu_s"] > 0


def test_loadgen_refuses_anything_but_loopback() -> None:
    with pytest.raises(SystemExit, match="127.0.0.1"):
        build_request("http://10.0.0.5:8000/v2/models/m/infer", b"", [])
    host, port, request = build_request("http://127.0.0.1:9/v2/models/m/infer", b"xy", ["A: b"])
    assert (host, port) == ("127.0.0.1", 9)
    assert request.startswith(b"POST /v2/models/m/infer HTTP/1.1\r\n") and request.endswith(
        b"\r\nA: b\r\n\r\nxy"
    )
    assert b"Content-Type: application/octet-stream" in request
    _, _, as_json = build_request("http://127.0.0.1:9/x", b"{}", ["Content-Type: application/json"])
    assert b"octet-stream" not in as_json and b"Content-Type: application/json" in as_json


@pytest.mark.slow
def test_ab_runs_each_variant_against_raw_between_runs() -> None:
    """Two real agents, each with its own config and environment, alternating with raw ONNX
    Runtime: each run is compared with the raw runs either side of it."""
    variants = [
        Variant.parse('{"name": "batching", "config": "[batching]\\nmax_batch_size = 8\\n"}'),
        Variant.parse(
            '{"name": "one-at-a-time", "config": "[batching]\\nmax_batch_size = 0\\n",'
            ' "env": {"EDGEFLEET_AGENT_MAX_CONCURRENT_REQUESTS": "1"}}'
        ),
    ]
    load = {"model": "mlp", "body": "json", "concurrency": 4, "duration_s": 0.5, "pairs": 2}
    report = compare(variants, **load, raw_instances=1, raw_batch=1)
    first, second = report["variants"]
    raws = [r["raw_around_rows_per_s"] for v in (first, second) for r in v["runs"]]
    assert len(first["runs"]) == len(second["runs"]) == 2 and all(a > 0 and b > 0 for a, b in raws)
    for run in first["runs"] + second["runs"]:
        low, high = run["raw_around_rows_per_s"]
        assert run["ratio_to_raw"] == pytest.approx(run["requests_per_s"] / ((low + high) / 2))
    assert set(first["runs"][0]["statuses"]) == {"200"}
    # the second variant's environment reached its agent, and only its: with 4 clients and
    # room for one request, the rest are refused
    assert all("503" in r["statuses"] for r in second["runs"])
    assert first["median_ratio_to_raw"] > 0
    # each variant's model as it loaded, from its metadata
    assert first["parameters"]["batched"] is True and first["parameters"]["max_batch_size"] == 8
    assert second["parameters"]["batched"] is False


def test_ab_refuses_a_variant_it_could_not_name_a_directory_after() -> None:
    with pytest.raises(SystemExit, match="name"):
        Variant.parse('{"name": "../x"}')
    with pytest.raises(SystemExit, match="unknown keys"):
        Variant.parse('{"name": "x", "confg": ""}')


@pytest.mark.slow
def test_call_count_counts_the_event_loops_calls_per_request() -> None:
    """The agent under the counting hook answers, and the counts are the loop's: the V2
    decoder and the batcher's submission are there once or more per request. (A lone fast
    request runs its batch on the loop too, so the batch's calls may be counted.)"""
    report = count_calls("mlp", "json", 2, 1.0, "", top=400)
    assert report["requests"] > 0
    functions = report["by_function"]
    decode = ["v2_codec.py", "decode_request"]
    # names are file:line:function
    decoded = [n for name, n in functions.items() if name.split(":")[::2] == decode]
    assert decoded and decoded[0] >= 1.0
    assert 50 < report["calls_per_request"] < 5000
