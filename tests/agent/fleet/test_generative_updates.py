"""Generative versions through the agent's fleet updater: a real Mosquitto, a test fleet that
signs manifests, an artifact server, and a real agent answering on its OpenAI-compatible API.

A ``genai`` artifact is downloaded and verified by digest, staged and switched to like any
version; on an agent whose repository held no generative model, the generative models are
built for it. A version that does not load is rejected with the reason while the previous one
serves; the fleet's rollback command switches back to the previous version."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimes.examples.tiny_lm import write_tiny_lm
from tests.agent.fleet.conftest import AgentFactory, fleet_settings
from tests.agent.fleet.publisher import Fleet
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.mqtt_broker import Mosquitto

PROMPT = {"model": "tiny-lm", "prompt": "edge devices", "max_tokens": 6, "temperature": 0}


def lm(directory: Path, seed: int) -> Path:
    directory.mkdir(parents=True)
    write_tiny_lm(directory, seed=seed)
    return directory


def serving(agent: RunningAgent) -> tuple[str, str]:
    """The version the OpenAI API serves and its greedy completion of :data:`PROMPT`."""
    cards = agent.client.get("/v1/models").json()["data"]
    resp = agent.client.post("/v1/completions", json=PROMPT)
    assert resp.status_code == 200, resp.text
    (card,) = [c for c in cards if c["id"] == "tiny-lm"]
    return str(card["version"]), str(resp.json()["choices"][0]["text"])


@pytest.mark.slow
def test_a_generative_model_new_to_the_agent_is_installed_and_reported(
    example_repo: Path, fleet: Fleet, broker: Mosquitto, tmp_path: Path
) -> None:
    v1 = lm(tmp_path / "v1", seed=7)
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")  # no generative model yet
    settings = fleet_settings(fleet, broker, tmp_path / "state")
    with serve(repo, fleet=settings, device_hourly_cost=0.36) as agent:
        assert agent.state.generative is None
        assert agent.client.get("/v1/models").status_code == 503
        fleet.publish_desired("dev-1", fleet.sign(fleet.manifest("tiny-lm", 1, 1, v1, fmt="genai")))
        fleet.wait_event("dev-1", "committed", sequence=1)
        assert serving(agent)[0] == "1"
        for _ in range(3):
            serving(agent)

        def tokens_reported() -> list[object]:
            return [
                m
                for t in fleet.telemetry("dev-1")
                for m in t.models
                if m.model == "tiny-lm" and m.generative and m.generative.generated_tokens
            ]

        window = fleet.wait(tokens_reported, what="telemetry with tiny-lm's tokens")[0]
        assert window.version == 1 and window.requests >= 1  # type: ignore[attr-defined]
        assert window.generative.ttft_p99_ms > 0  # type: ignore[attr-defined]
        assert window.generative.prompt_tokens > 0  # type: ignore[attr-defined]
        # the device's 0.36 an hour over the window, per thousand tokens of it
        assert window.generative.cost_per_1k_tokens > 0  # type: ignore[attr-defined]

        def status_lists_it() -> list[object]:
            return [
                s
                for s in fleet.statuses("dev-1")
                if s.online and any(m.model == "tiny-lm" for m in s.models)
            ]

        status = fleet.wait(status_lists_it, what="a status listing tiny-lm")[-1]
        assert ("tiny-lm", 1, 1) in [(m.model, m.version, m.sequence) for m in status.models]  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_broken_version_is_rejected_and_a_rollback_restores_the_previous(
    example_repo: Path, fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "tiny-lm")
    broken = lm(tmp_path / "broken", seed=8)
    (broken / "model.onnx").write_bytes(b"not an onnx model")
    v3 = lm(tmp_path / "v3", seed=9)
    with fleet_agent(repo=repo) as agent:
        before = serving(agent)
        assert before[0] == "1"
        fleet.publish_desired(
            "dev-1", fleet.sign(fleet.manifest("tiny-lm", 2, 1, broken, fmt="genai"))
        )
        rejected = fleet.wait_event("dev-1", "rejected", sequence=1)
        assert rejected.code == "load_failed" and "tiny-lm" in (rejected.reason or "")
        assert serving(agent) == before  # version 1 served throughout
        assert not (repo / "tiny-lm" / "2").exists()
        shadow = fleet.manifest("tiny-lm", 2, 3, lm(tmp_path / "shadow", seed=10), fmt="genai")
        shadow["shadow"] = {"sample_share": 0.5}  # shadows compare tensors: batch models only
        fleet.publish_desired("dev-1", fleet.sign(shadow))
        refused = fleet.wait_event("dev-1", "rejected", sequence=3)
        assert "a shadow stage is for batch models" in (refused.reason or ""), refused
        assert serving(agent) == before
        fleet.publish_desired("dev-1", fleet.sign(fleet.manifest("tiny-lm", 3, 4, v3, fmt="genai")))
        fleet.wait_event("dev-1", "committed", sequence=4)
        version, text = serving(agent)
        assert version == "3" and text != before[1]
        fleet.command("dev-1", "tiny-lm", from_version=3)
        fleet.wait_event("dev-1", "rolled_back")
        wait_until(lambda: serving(agent) == before, what="version 1 serving again")
        config = (repo / "tiny-lm" / "config.toml").read_text()
        assert "specific = [\n    1,\n]" in config or "specific = [1]" in config, config
