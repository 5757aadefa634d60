"""The benchmark suite's parts: real servers measured through the real load generator, the
batch statistics read back from the agent, and the report with its goals and plots."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson
import pytest

from benchmarks.serving.bodies import make_bodies
from benchmarks.serving.goals import evaluate, lean_reference
from benchmarks.serving.plots import raw_label
from benchmarks.serving.report import render
from benchmarks.serving.serving import raw_throughput
from benchmarks.serving.suite import measure
from benchmarks.serving.systems import agent, fastapi_endpoint, lean_server
from runtimes.backends import open_model
from runtimes.base import Placement
from tests.agent.server import copy_models


@pytest.mark.slow
def test_measure_agent_and_plain_endpoint_side_by_side(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    bodies = make_bodies("mlp")
    logs = tmp_path / "logs"
    logs.mkdir()
    with agent(repo, "mlp", bodies.json[0], logs) as a:
        served = measure(a, "mlp", bodies, "binary", 4, 1.0)
    with fastapi_endpoint(repo / "mlp" / "1" / "model.onnx", "mlp", bodies.json[0], logs) as f:
        plain = measure(f, "mlp", bodies, "json", 4, 1.0)
    for result in (served, plain):
        assert set(result["statuses"]) == {"200"} and result["errors"] == 0
        assert result["requests_per_s"] > 0 and result["server_cpu_cores"] > 0
        assert result["p50_ms"] <= result["p95_ms"] <= result["p99_ms"]
    # the agent's batch statistics come from its own metrics: rows per batch lie in 1..4
    assert 1 <= served["mean_batch_rows"] <= 4
    assert served["batch_histogram"]["+Inf"] > 0
    assert plain["mean_batch_rows"] == 1


def _serving(agent_rps: float | list[float], fastapi_rps: float | list[float]) -> dict[str, object]:
    def cell(system: str, body: str, conc: int, rps: float | list[float]) -> dict[str, object]:
        return {
            "model": "mlp",
            "system": system,
            "body": body,
            "concurrency": conc,
            "runs": [run(r) for r in (rps if isinstance(rps, list) else [rps])],
        }

    def run(rps: float) -> dict[str, object]:
        return {
            "requests_per_s": rps,
            "p50_ms": 10.0,
            "p95_ms": 20.0,
            "p99_ms": 40.0,
            "statuses": {"200": 100},
            "errors": 0,
            "server_cpu_ms_per_inference": 1.0,
            "mean_batch_rows": 4.0,
            "server_cpu_cores": 1.0,
            "client_cpu_cores": 0.1,
            "batch_histogram": {"1.0": 10, "4.0": 90, "+Inf": 100},
        }

    cells = [
        cell("agent", "json", 32, agent_rps),
        cell("fastapi", "json", 32, fastapi_rps),
        cell("agent", "binary", 32, agent_rps),
    ]
    raw = {"best_batch": 8, "calibration_rows_per_s": {}, "runs_rows_per_s": [1000.0]}
    return {
        "duration_s": 1,
        "repeat": 1,
        "concurrency": [32],
        "models": [
            {
                "model": "mlp",
                "raw": raw,
                "cells": cells,
                "overload": None,
                "agent_parameters": {
                    "agent": {
                        "batched": False,
                        "max_batch_size": 1,
                        "batch_tuning": {
                            "max_batch_size": 1,
                            "rows_per_s": {"1": 163.0, "2": 156.1},
                            "elapsed_s": 0.127,
                        },
                    },
                    "agent-nobatch": {"batched": False, "max_batch_size": 1},
                },
            }
        ],
    }


def test_goals_compare_figures_of_the_same_run() -> None:
    goals = {g.name: g for g in evaluate(_serving(300, 100), None, None)}
    assert goals["mlp, JSON V2, c=32: agent / plain FastAPI"].met
    assert not goals["mlp, JSON V2, c=32: agent / MLServer"].met  # not measured is not met
    assert goals["mlp, json V2, c=32: agent p99 / p50"].measured.startswith("4.00 x")
    assert not goals["mlp, json V2, c=32: agent p99 / p50"].met
    slower = {g.name: g for g in evaluate(_serving(150, 100), None, None)}
    assert not slower["mlp, JSON V2, c=32: agent / plain FastAPI"].met


def test_a_ratio_goal_pairs_the_systems_within_each_repetition() -> None:
    """The systems of a repetition are measured seconds apart; the machine's speed moves
    between repetitions. The medians alone (300 vs 100) would say 3 x; within repetitions the
    agent served 3, 2 and 2 times as much."""
    goals = {g.name: g for g in evaluate(_serving([300, 200, 300], [100, 100, 150]), None, None)}
    fastapi = goals["mlp, JSON V2, c=32: agent / plain FastAPI"]
    assert fastapi.measured.startswith("2.00 x (within repetitions 3.00, 2.00, 2.00; medians")
    assert "3.00 x)" in fastapi.measured and fastapi.met
    below = {g.name: g for g in evaluate(_serving([300, 190, 300], [100, 100, 151]), None, None)}
    assert not below["mlp, JSON V2, c=32: agent / plain FastAPI"].met  # 1.99: not 2


def test_the_cnn_goal_compares_with_raw_measured_around_each_run() -> None:
    """Raw ONNX Runtime is measured right before and right after each run of the goal's cell
    (the machine's speed moves in the minutes between a repetition's start and the cell); the
    comparison with the raw run at the start of each repetition is shown beside it."""
    serving = _serving(300, 100)
    pairs = ((90.0, [100.0, 100.0]), (135.0, [140.0, 160.0]), (92.0, [100.0, 110.0]))
    runs = [{"requests_per_s": rps, "raw_around_rows_per_s": around} for rps, around in pairs]
    cell = {"model": "cnn", "system": "agent", "body": "binary", "concurrency": 8, "runs": runs}
    raw = {"best_batch": 2, "calibration_rows_per_s": {}, "runs_rows_per_s": [120.0] * 3}
    serving["models"].append({"model": "cnn", "raw": raw, "cells": [cell], "overload": None})  # type: ignore[attr-defined]
    goals = {g.name: g for g in evaluate(serving, None, None)}
    goal = goals["cnn, binary V2, c=8: agent / raw ONNX Runtime best in-process"]
    assert goal.measured.startswith("0.90 x (within repetitions 0.90, 0.90, 0.88; medians 92 vs")
    assert goal.measured.endswith("at each repetition's start: 0.77 x)")
    assert goal.met  # 0.90 around each run, where the repetitions' start says 0.77
    assert lean_reference(serving) is None  # no lean server in this run
    lean = [{"requests_per_s": 95.0, "raw_around_rows_per_s": [100.0, 100.0]}] * 3
    cell = {"model": "cnn", "system": "lean", "body": "binary", "concurrency": 8, "runs": lean}
    serving["models"][-1]["cells"].append(cell)  # type: ignore[index]
    reference = lean_reference(serving)
    assert (
        reference is not None and "served 0.95 x (within repetitions 0.95, 0.95, 0.95" in reference
    )
    assert [g.name for g in evaluate(serving, None, None)] == list(goals)  # not a goal


def test_report_writes_the_page_and_every_cell_apart(tmp_path: Path) -> None:
    """The page gives the goals, the method, the machine, how to rerun and the plots; the
    tables of every cell go to the runs file, which the page links to, and not on the page."""
    footprint = {
        "repeat": 1,
        "summary": {
            "agent-cold": {"idle_rss_mb": 110.0, "start_to_first_inference_s": 1.5, "processes": 1},
            "fastapi": {"idle_rss_mb": 100.0, "start_to_first_inference_s": 1.0, "processes": 1},
        },
    }
    docs, runs = tmp_path / "docs", tmp_path / "benchmarks" / "runs.md"
    serving = _serving(300, 100)
    target = render(serving, footprint, None, docs, "python -m benchmarks --quick", runs, "at abc")
    page, cells = target.read_text(), runs.read_text()
    assert target == docs / "benchmarks.md"
    assert (
        "| idle RSS with mlp: agent / plain FastAPI | <= 1.2 x | 1.10 x (110 vs 100 MB) | met |"
        in page
    )
    assert "Command: `python -m benchmarks --quick` at abc." in page.splitlines()
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert headings == [
        "## Goals",
        "## Method",
        "## Machine",
        "## How to rerun",
        "## Plots",
    ]
    # the method says what the run measured: its concurrency, cell length and repetitions
    assert "at concurrency 32, 1 s per cell, 1 repetitions" in page
    assert f"| cores | {os.cpu_count()} |" in page
    assert "python -m benchmarks.serving.suite --models cnn" in page
    assert "[benchmarks/runs.md](../benchmarks/runs.md)" in page
    # every cell is in the runs file, and the page holds none of the cells' tables
    assert "| agent (json) | 300 |" in cells and "| agent (json) | 300 |" not in page
    assert "| agent (binary) | 10.0 | 20.0 | 40.0 | 1.00 | 4.0 | 1.00 | 0.10 | 0 |" in cells
    assert "| agent-cold | 110 | 1.50 | 1 |" in cells
    assert "[docs/benchmarks.md](../docs/benchmarks.md)" in cells
    # what [batching] tune measured at load, and what the agent served with
    assert (
        "`agent` measured at load (`[batching] tune`, 0.13 s) rows/s of 163 at 1, 156 at 2 rows, "
        "and served with no batching." in cells
    )
    for name in ("throughput-mlp.png", "latency-mlp.png", "batches-mlp.png"):
        png = docs / "benchmarks" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(benchmarks/{name})" in page and name not in cells


def test_the_raw_line_names_its_sessions_and_batch() -> None:
    assert raw_label({"best_batch": 8}) == "raw ONNX Runtime, batch 8"
    assert raw_label({"best_batch": 2, "best_instances": 2}) == (
        "raw ONNX Runtime, 2 sessions x batch 2"
    )


def test_bench_command_renders_saved_results(tmp_path: Path) -> None:
    """``python -m benchmarks`` with every part skipped renders the results it finds: the page
    and the runs file, with no commit or hours for a run it did not make."""
    from click.testing import CliRunner

    from benchmarks.run import bench

    results = tmp_path / "results"
    results.mkdir()
    (results / "serving.json").write_text(json.dumps(_serving(300, 100)))
    out, runs = tmp_path / "docs", tmp_path / "runs.md"
    args = ["--out", str(out), "--runs", str(runs), "--results", str(results)]
    args += ["--duration", "1", "--repeat", "1"]
    args += ["--skip", "serving", "--skip", "footprint", "--skip", "fleet"]
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 0, result.output
    text = (out / "benchmarks.md").read_text()
    assert (
        "| mlp, JSON V2, c=32: agent / plain FastAPI | >= 2 x | 3.00 x (within repetitions 3.00; "
        "medians 300 vs 100 req/s, 3.00 x) | met |" in text
    )
    command = next(line for line in text.splitlines() if line.startswith("Command: "))
    assert command.endswith("`.") and "UTC" not in command  # no commit or hours after it
    assert "| fastapi (json) | 100 |" in runs.read_text()


@pytest.mark.slow
def test_a_model_config_reaches_both_agents_and_raw_runs_sessions_side_by_side(
    example_repo: Path, tmp_path: Path
) -> None:
    """The suite's per-model configuration (two instances for cnn) is what the agents serve,
    batching on and off; and the raw reference can run as many sessions side by side."""
    bodies = make_bodies("mlp")
    logs = tmp_path / "logs"
    logs.mkdir()
    for batching in (True, False):
        repo = copy_models(example_repo, tmp_path / f"repo-{batching}", "mlp")
        with agent(
            repo, "mlp", bodies.json[0], logs, config="instances = 2\n", batching=batching
        ) as a:
            config = httpx.get(f"{a.base_url}/v2/models/mlp/config").json()["edgefleet"]
        assert config["instances"] == 2
        # batching on: its size measured at load (0 where it did not pay)
        tuned = config["batch_tuning"]["max_batch_size"] if batching else 0
        assert config["batching"]["max_batch_size"] in {0, tuned}
    model_file = example_repo / "mlp" / "1" / "model.onnx"
    assert raw_throughput(model_file, bodies.row, 4, 0.2, instances=2) > 0


def test_fleet_table_shows_the_bare_rate_before_and_after_the_sweep() -> None:
    """The ratio is to the median of the bare rates on both sides of the sweep; the table
    shows each side, so a machine that changed speed during the sweep shows."""
    from benchmarks.serving.tables import fleet_section

    size = {
        "devices": 5000,
        "summary": {"rollout_99pct_committed_s": 9.4, "rollback_99pct_reverted_s": 6.2},
        "ingest": {
            "bare_before_per_s": 39530.0,
            "bare_after_per_s": 30100.0,
            "bare_delivered_per_s": 34000.0,
            "sweep": {"max_lossless_per_s": 17690.0},
            "ratio_to_bare": 0.52,
        },
    }
    text = "\n".join(fleet_section({"sizes": [size], "command": "fleet"}))
    assert "| 5,000 | 9.4 | 6.2 | 17,690 | 34,000 | 39,530 / 30,100 | 0.52 |" in text


def test_lean_server_answers_as_the_runtime_does_binary_json_and_pipelined(
    example_repo: Path, tmp_path: Path
) -> None:
    """The scale for the cnn goal is a real server: the tensors it answers are the session's,
    in V2 binary and JSON, two requests sent in one write are answered in order, and what it
    does not serve is refused, not dropped."""
    bodies = make_bodies("mlp")
    model_file = example_repo / "mlp" / "1" / "model.onnx"
    logs = tmp_path / "logs"
    logs.mkdir()
    placement = Placement(runtime="onnxruntime", providers=("CPUExecutionProvider",))
    runtime = open_model(model_file, placement)
    (expected,) = runtime.infer({"input": bodies.row}).values()
    runtime.close()
    with lean_server(model_file, "mlp", bodies.json[0], logs, instances=2) as lean:
        url = f"{lean.base_url}/v2/models/mlp/infer"
        body, headers = bodies.binary
        answer = httpx.post(url, content=body, headers=dict(h.split(": ") for h in headers))
        as_json = httpx.post(url, content=bodies.json[0]).json()
        assert httpx.get(f"{lean.base_url}/v2/health/ready").status_code == 404
        assert httpx.post(url, content=b'{"inputs": [').status_code == 400
        parts = urlsplit(lean.base_url)
        with socket.create_connection((parts.hostname, parts.port)) as raw:
            head = b"POST /v2/models/mlp/infer HTTP/1.1\r\ncontent-length: %d\r\n\r\n"
            request = head % len(bodies.json[0]) + bodies.json[0]
            raw.sendall(request + request[:-1])
            raw.sendall(request[-1:])
            replies = _read_responses(raw, 2)
        measured = measure(lean, "mlp", bodies, "binary", 4, 0.5)
    length = int(answer.headers["inference-header-content-length"])
    tensor = np.frombuffer(answer.content[length:], np.float32).reshape(expected.shape)
    np.testing.assert_array_equal(tensor, expected)
    assert as_json["outputs"][0]["shape"] == list(expected.shape)
    np.testing.assert_allclose(as_json["outputs"][0]["data"], expected.ravel(), rtol=1e-6)
    assert [orjson.loads(r)["outputs"][0]["data"] for r in replies] == [
        as_json["outputs"][0]["data"]
    ] * 2
    assert set(measured["statuses"]) == {"200"} and measured["mean_batch_rows"] == 1


def _read_responses(sock: socket.socket, count: int) -> list[bytes]:
    """The bodies of ``count`` responses with a content length, read from ``sock``."""
    data, bodies = b"", []
    while len(bodies) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            length = int(re.search(rb"content-length: (\d+)", data[:end]).group(1))  # type: ignore[union-attr]
            if len(data) >= end + 4 + length:
                bodies.append(data[end + 4 : end + 4 + length])
                data = data[end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    return bodies
