"""Two control plane replicas on one PostgreSQL database and one Mosquitto, two real agent
processes: the leader is SIGKILLed while wave 1 of a rollout bakes. The other replica leads
within 10 s, the rollout completes, and every device's telemetry 1..N is stored exactly once
and acknowledged to the device end to end (by whichever replica stored it)."""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from agent.fleet.settings import FleetSettings
from runtimes.examples.variants import mlp_version
from tests.agent.process import AgentProcess, agent_process
from tests.agent.server import copy_models, wait_until
from tests.control_plane.enrolment.conftest import postgresql_database
from tests.control_plane.leadership.processes import (
    Replica,
    agent_config,
    every_seq_stored_once,
    leader,
    replica,
)
from tests.control_plane.test_rollouts import push, validate
from tests.mqtt_broker import Mosquitto, free_port

pytestmark = pytest.mark.slow

DEVICES = ("dev-1", "dev-2")
STORED = "edgefleet_telemetry_messages_total"


def served(agent: AgentProcess) -> str:
    body = {
        "inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.0] * 256}]
    }
    resp = httpx.post(f"{agent.address}/v2/models/mlp/infer", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["model_version"])


def telemetry_stored_by(cp: Replica) -> float:
    for line in cp.admin.get("/metrics").text.splitlines():
        if line.startswith(STORED + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {STORED} in {cp.name}'s metrics")


def test_leader_sigkilled_mid_rollout_another_leads_and_no_telemetry_is_lost_or_doubled(
    example_repo: Path, tmp_path: Path
) -> None:
    state = tmp_path / "cp"  # keys, admin token, artifacts: shared by the replicas
    with ExitStack() as stack:
        db_url = stack.enter_context(postgresql_database())
        broker = Mosquitto(tmp_path / "broker").start()
        stack.callback(broker.stop)
        port_a, port_b = free_port(), free_port()
        # devices fetch artifacts through the load balancer: here, the replica that survives
        balancer = f"http://127.0.0.1:{port_b}"
        a = stack.enter_context(replica("cp-a", state, db_url, broker.url, port_a, balancer))
        wait_until(lambda: (leader(db_url) or "").startswith("edgefleet-cp-a:"), what="a leads")
        b = stack.enter_context(replica("cp-b", state, db_url, broker.url, port_b, balancer))
        agents: dict[str, AgentProcess] = {}
        for device_id in DEVICES:
            fleet = FleetSettings(
                mqtt_url=broker.url,
                device_id=device_id,
                labels={"site": "lab"},
                state_dir=tmp_path / f"state-{device_id}",
                trust_root_file=state / "trust-root.json",
                telemetry_interval_s=0.1,
                telemetry_resend_s=1.0,  # what a dead replica held unstored comes again soon
                reconnect_min_s=0.05,
                reconnect_max_s=0.5,
            )
            repo = copy_models(example_repo, tmp_path / f"repo-{device_id}", "mlp")
            config = agent_config(tmp_path / f"{device_id}.toml", repo, fleet)
            agents[device_id] = stack.enter_context(agent_process("--config", str(config)))

        def online() -> bool:  # any replica serves the API: b follows, and answers
            devices = b.admin.get("/api/v1/devices").json()
            return sum(bool(d["online"]) for d in devices) == len(DEVICES)

        wait_until(online, timeout_s=60, what="both devices in the inventory")
        push(a.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        assert validate(a.admin, "mlp", 2)["passed"]
        spec = {
            "model": "mlp",
            "version": 2,
            "selector": {"site": "lab"},
            "waves": ["1", "100%"],
            "bake_time_s": 1,
            "device_timeout_s": 60,
            "gates": {"allow_unjudged": True},  # no traffic here
        }
        resp = b.admin.post("/api/v1/rollouts", json=spec)  # the follower takes it: a steps it
        assert resp.status_code == 201, resp.text
        rollout_id = int(resp.json()["id"])
        wait_until(
            lambda: "2" in [served(agent) for agent in agents.values()],
            timeout_s=60,
            what="wave 1",
        )
        # both replicas ingest: the broker splits the shared subscription between them
        assert telemetry_stored_by(a) > 0 and telemetry_stored_by(b) > 0

        a.proc.send_signal(signal.SIGKILL)  # the leader, while wave 1 bakes
        a.proc.wait(timeout=30)
        killed = time.monotonic()
        assert sorted(served(agent) for agent in agents.values()) == ["1", "2"]
        wait_until(
            lambda: (leader(db_url) or "").startswith("edgefleet-cp-b:"),
            timeout_s=30,
            what="b to lead",
        )
        assert time.monotonic() - killed < 10

        def rollout() -> dict[str, object]:
            doc: dict[str, object] = b.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
            return doc

        wait_until(lambda: rollout()["state"] != "running", timeout_s=60, what="the rollout")
        assert rollout()["state"] == "succeeded", rollout()
        assert [served(agent) for agent in agents.values()] == ["2", "2"]

        # the sequence check: 1..N stored exactly once for every device, and acknowledged
        marks = every_seq_stored_once(db_url, {d: tmp_path / f"state-{d}" for d in DEVICES})
        assert min(marks.values()) > 50
