"""A generative model through the fleet, end to end: a real Mosquitto, a real control plane on
SQLite, a real agent serving ``tiny-lm`` version 1 through its OpenAI-compatible API.
``edgefleet models push`` uploads version 2 (other weights), validation decodes it on every
runtime here, a rollout with TTFT and inter-token gates switches the agent to it while clients
stream completions, and a gate set impossibly low rolls the agent back to version 1, which
serves again. The fleet's telemetry shows each version's tokens and token latencies."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtimes.examples.tiny_lm import write_tiny_lm
from tests.agent.server import RunningAgent, wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_operations import edgefleet
from tests.control_plane.test_rollouts import validate, wait_devices, wait_rollout

PROMPT = {"model": "tiny-lm", "prompt": "The fleet says", "max_tokens": 8, "temperature": 0}
HEALTH = "[health]\nwindow_s = 0.2\nmin_requests = 100000\n"  # devices commit; the gates judge


def served_version(agent: RunningAgent) -> str:
    (card,) = agent.client.get("/v1/models").json()["data"]
    return str(card["version"])


def complete(agent: RunningAgent) -> str:
    resp = agent.client.post("/v1/completions", json=PROMPT)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["choices"][0]["text"])


@contextmanager
def traffic(agent: RunningAgent) -> Iterator[list[int]]:
    """Clients completing prompts back to back while the block runs; yields their statuses."""
    stop, statuses = threading.Event(), list[int]()

    def client() -> None:
        with httpx.Client(base_url=agent.url, timeout=30) as http:
            while not stop.is_set():
                statuses.append(http.post("/v1/completions", json=PROMPT).status_code)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        yield statuses
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)


def push_v2(cp: RunningControlPlane, tmp_path: Path) -> None:
    folder = tmp_path / "tiny-lm-v2"
    folder.mkdir()
    write_tiny_lm(folder, seed=4802)
    config = tmp_path / "serving.toml"
    config.write_text(HEALTH)
    token = cp.token("operator")
    pushed = edgefleet(
        cp, token, "models", "push", "tiny-lm", "2", str(folder), "--config", str(config)
    )
    assert pushed.returncode == 0, pushed.stderr
    assert validate(cp.admin, "tiny-lm", 2)["passed"]


def roll_out(cp: RunningControlPlane, **gates: Any) -> int:
    token = cp.token("operator")
    args = ["--model", "tiny-lm", "--version", "2", "--selector", "site=lab", "--waves", "1"]
    args += ["--bake-time", "3", "--device-timeout", "60", "--min-requests", "5", "--json"]
    for name, value in gates.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    created = edgefleet(cp, token, "rollouts", "create", *args)
    assert created.returncode == 0, created.stderr
    import json

    return int(json.loads(created.stdout)["id"])


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_generative_version_rolls_out_with_token_gates_and_serves(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    with (
        start_control_plane() as cp,
        start_agent("dev-a", cp, models=("tiny-lm",), device_hourly_cost=0.36) as a,
    ):
        wait_devices(cp, "dev-a")
        before = complete(a)
        assert served_version(a) == "1"
        push_v2(cp, tmp_path)
        with traffic(a) as statuses:
            rollout_id = roll_out(cp, max_ttft_p99_ms=30000, max_inter_token_p99_ms=30000)
            doc = wait_rollout(cp, rollout_id, "succeeded", "rolled_back")
        assert doc["state"] == "succeeded", doc
        assert statuses and set(statuses) <= {200, 503}, set(statuses)  # 503: in the switch
        assert served_version(a) == "2"
        assert complete(a) != before  # other weights, other greedy text
        report = doc["gate_report"]["0"]
        assert report["ttft_p99_ms"] > 0 and report["inter_token_p99_ms"] > 0, report
        assert report["generated_tokens"] > 0
        windows = cp.admin.get(
            "/api/v1/telemetry", params={"model": "tiny-lm", "version": 2}
        ).json()
        assert sum(w["generated_tokens"] for w in windows) > 0
        assert any(w["tokens_per_s"] and w["ttft_p99_ms"] for w in windows), windows[:3]
        assert any(w["cost_per_1k_tokens"] for w in windows), windows[:3]  # 0.36 an hour
        metrics = cp.admin.get("/metrics").text
        assert 'edgefleet_fleet_generated_tokens_total{model="tiny-lm",version="2"}' in metrics
        assert 'edgefleet_fleet_cost_per_1k_tokens{model="tiny-lm",version="2"}' in metrics


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_failing_token_gate_rolls_the_generative_model_back(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp, models=("tiny-lm",)) as a:
        wait_devices(cp, "dev-a")
        before = complete(a)
        push_v2(cp, tmp_path)
        with traffic(a):
            rollout_id = roll_out(cp, max_inter_token_p99_ms=0.001)
            doc = wait_rollout(cp, rollout_id, "rolled_back", "succeeded")
        assert doc["state"] == "rolled_back", doc
        assert "inter-token latency" in doc["reason"] and "0.001 ms" in doc["reason"], doc
        states = {d["device_id"]: d["state"] for d in doc["devices"]}
        assert states == {"dev-a": "reverted"}
        wait_until(lambda: served_version(a) == "1", what="dev-a to serve version 1 again")
        assert complete(a) == before  # version 1's greedy text, as before the rollout
