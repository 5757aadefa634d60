"""The control plane SIGKILLed mid-rollout, as a real process: restarted on the same database,
it resumes the rollout and completes it."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from agent.fleet.settings import FleetSettings
from runtimes.examples.variants import mlp_version
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.control_plane.test_rollouts import push, served, validate
from tests.faults.conftest import missing_telemetry, oldest_held, stored_seqs
from tests.faults.cp_process import ControlPlaneProcess, control_plane_process
from tests.mqtt_broker import Mosquitto, free_port

pytestmark = pytest.mark.slow


def _rollout(cp: ControlPlaneProcess, rollout_id: int) -> dict[str, Any]:
    doc: dict[str, Any] = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
    return doc


def test_control_plane_sigkilled_while_wave_1_bakes_resumes_and_completes(
    broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    db_url = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
    port = free_port()  # kept across the restart: manifests carry artifact URLs on it

    def start_cp() -> Any:
        return control_plane_process(tmp_path / "cp", db_url, broker.url, port)

    def agent(device_id: str, cp: ControlPlaneProcess) -> Any:
        fleet = FleetSettings(
            mqtt_url=broker.url,
            device_id=device_id,
            labels={"site": "lab"},
            state_dir=tmp_path / f"state-{device_id}",
            trust_root_file=cp.trust_root_file,
            telemetry_interval_s=0.2,
            reconnect_min_s=0.05,
            reconnect_max_s=0.5,
        )
        return serve(copy_models(example_repo, tmp_path / f"repo-{device_id}", "mlp"), fleet=fleet)

    with ExitStack() as stack:
        first = stack.enter_context(start_cp())
        a: RunningAgent = stack.enter_context(agent("dev-a", first))
        b: RunningAgent = stack.enter_context(agent("dev-b", first))

        def online() -> bool:
            devices = first.admin.get("/api/v1/devices").json()
            return sum(bool(d["online"]) for d in devices) == 2

        wait_until(online, timeout_s=60, what="both devices in the inventory")
        push(first.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        assert validate(first.admin, "mlp", 2)["passed"]
        spec = {
            "model": "mlp",
            "version": 2,
            "selector": {"site": "lab"},
            "waves": ["1", "100%"],
            "bake_time_s": 3,
            "device_timeout_s": 60,
            "gates": {"allow_unjudged": True},  # no traffic here
        }
        resp = first.admin.post("/api/v1/rollouts", json=spec)
        assert resp.status_code == 201, resp.text
        rollout_id = int(resp.json()["id"])
        wait_until(lambda: "2" in (served(a), served(b)), timeout_s=60, what="wave 1")
        first.proc.send_signal(signal.SIGKILL)  # while wave 1 bakes
        first.proc.wait(timeout=30)
        assert sorted((served(a), served(b))) == ["1", "2"]  # wave 2 has not started
        assert _rollout_state_on_disk(tmp_path / "cp.db", rollout_id) == "running"
        with start_cp() as again:  # same database, keys, port and MQTT session
            wait_until(
                lambda: _rollout(again, rollout_id)["state"] != "running",
                timeout_s=90,
                what="the rollout to finish after the restart",
            )
            doc = _rollout(again, rollout_id)
            assert doc["state"] == "succeeded", doc
            assert served(a) == served(b) == "2"
            assert [w["states"] for w in doc["waves"]] == [{"committed": 1}, {"committed": 1}]


def _rollout_state_on_disk(db: Path, rollout_id: int) -> str:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT state FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
    return str(row[0])


def test_control_plane_sigkilled_under_telemetry_loses_none_of_it(
    broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    db_url = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
    port = free_port()
    with control_plane_process(tmp_path / "cp", db_url, broker.url, port) as first:
        fleet = FleetSettings(
            mqtt_url=broker.url,
            device_id="dev-t",
            state_dir=tmp_path / "state",
            trust_root_file=first.trust_root_file,
            telemetry_interval_s=0.01,
            reconnect_min_s=0.05,
            reconnect_max_s=0.5,
        )
        repo = copy_models(example_repo, tmp_path / "repo", "mlp")
        with serve(repo, fleet=fleet) as agent:
            client = agent.state.fleet
            assert client is not None
            wait_until(lambda: len(stored_seqs(db_url, "dev-t")) > 50, what="telemetry stored")
            first.proc.send_signal(signal.SIGKILL)  # with messages received and not yet written
            first.proc.wait(timeout=30)
            with control_plane_process(tmp_path / "cp", db_url, broker.url, port):
                mark = client.outbox_seq()
                wait_until(lambda: len(stored_seqs(db_url, "dev-t")) > mark, what="telemetry again")
                produced = client.outbox_seq()
                # every message up to here acknowledged (telemetry keeps coming, each held until the
                # control plane's next acknowledgement, so the outbox itself is never empty for long)
                wait_until(
                    lambda: oldest_held(tmp_path / "state") > produced,
                    timeout_s=90,
                    what="the outbox to drain",
                )
                missing = missing_telemetry(db_url, "dev-t", produced)
    assert not missing, f"{len(missing)} of {produced} lost: {sorted(missing)[:20]}"
