"""schemathesis against the OpenAPI documents of the agent and the control plane, served by
real processes on 127.0.0.1: thousands of generated requests (fitting the schemas and not),
and not one 5xx or unanswered request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.agent.models import write_upper_model
from tests.agent.process import AgentProcess, agent_process
from tests.agent.server import copy_models, wait_until
from tests.control_plane.server import control_plane
from tests.hardening.fuzz import fuzz
from tests.mqtt_broker import Mosquitto, free_port

KEY = "fuzzing-key-3c9a"


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("fuzz-agent")
    repo = copy_models(example_repo, root / "repo", "mlp")
    write_upper_model(repo)  # BYTES in and out
    args = ["--model-repository", str(repo), "--port", "0"]
    with agent_process(*args, env={"EDGEFLEET_AGENT_API_KEY": KEY}) as running:
        wait_until(
            lambda: httpx.get(f"{running.address}/v2/health/ready").status_code == 200,
            what="the models to load",
        )
        yield running


@pytest.mark.slow
def test_agent_openapi_no_5xx_no_hang(agent: AgentProcess) -> None:
    with httpx.Client(base_url=agent.address, headers={"X-API-Key": KEY}) as client:
        doc = client.get("/openapi.json").json()
    models = [{"model_name": m} for m in ("mlp", "upper")]
    report = fuzz(
        doc,
        agent.address,
        examples=7,
        fixed_examples=20,
        headers={"X-API-Key": KEY},
        path_variants=[*models, {"model_name": "mlp", "model_version": "1"}],
    )
    print(report.summary())
    assert not report.failures, "\n".join(report.failures[:20])
    assert report.cases >= 1500 and len(report.per_operation) == len(
        [op for path in doc["paths"].values() for op in path]
    )
    # the cases reached the codecs and the models, not only the 404 of random names
    assert report.statuses[200] >= 50 and report.statuses[400] >= 150
    assert agent.proc.poll() is None


@pytest.mark.slow
def test_control_plane_openapi_no_5xx_no_hang(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "broker").start()
    try:
        db = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
        with control_plane(tmp_path / "cp", db, broker.url, free_port()) as cp:
            created = cp.admin.post(
                "/api/v1/models/mlp/versions", json={"version": 1, "variants": [{"format": "onnx"}]}
            )
            assert created.status_code == 201, created.text
            doc = cp.admin.get("/openapi.json").json()
            token = str(cp.admin.headers["authorization"])
            report = fuzz(
                doc,
                cp.url,
                examples=15,
                fixed_examples=20,
                headers={"Authorization": token},
                path_variants=[{"name": "mlp"}, {"name": "mlp", "version": "1"}],
            )
            print(report.summary())
            assert not report.failures, "\n".join(report.failures[:20])
            assert report.cases >= 1000
            assert report.statuses[200] + report.statuses[201] >= 100
            assert cp.admin.get("/health").status_code == 200
    finally:
        broker.stop()
