"""A device's logs and support bundle with a real agent, broker and control plane: an
operator asks through the API and the CLI, the device answers in acknowledged chunks on its
telemetry topic, and what arrives holds the lines the test caused, the served versions, the
metrics and the outbox, and none of the secrets planted in the agent's settings and
environment; the size cap holds; a forged or unsigned command is refused (and logged);
a viewer may neither ask nor read."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from pydantic import SecretStr

from agent.fleet.settings import FleetSettings
from agent.main import configure_agent_logging
from common.protocol.messages import Command, CommandType
from common.protocol.signing import SigningKey, sign_envelope
from common.protocol.topics import Topics
from runtimes.examples import write_example_repository
from tests.agent.server import copy_models, serve, wait_until
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import Mosquitto, free_port, stop_paho

BROKER_PASSWORD = "planted-broker-pw-7f3a91"
API_KEY = "planted-api-key-c0ffee42"
DEVICE = "logs-box"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    mosquitto = Mosquitto(tmp_path_factory.mktemp("logs-broker")).start()
    yield mosquitto
    mosquitto.stop()


@pytest.fixture(scope="module")
def cp(
    tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto
) -> Iterator[RunningControlPlane]:
    root = tmp_path_factory.mktemp("logs-cp")
    with control_plane(
        root / "cp", f"sqlite+aiosqlite:///{root}/cp.db", broker.url, free_port()
    ) as running:
        yield running


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The agent's logging as ``run`` sets it up, undone after (the test's process is shared)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers:
        if h not in handlers:
            h.close()
    root.handlers[:], root.level = handlers, level


def edgefleet(cp: RunningControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "edgefleet"
    token = cp.admin.headers["Authorization"].removeprefix("Bearer ")
    env = {**os.environ, "EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": token}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=120)


def publish(broker: Mosquitto, topic: str, payload: bytes) -> None:
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=f"forger-{uuid.uuid4().hex[:6]}"
    )
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        client.publish(topic, payload, qos=1).wait_for_publish(timeout=10)
    finally:
        stop_paho(client)


def answered(cp: RunningControlPlane, doc: dict[str, Any]) -> dict[str, Any]:
    path = f"/api/v1/devices/{DEVICE}/diagnostics/{doc['id']}"
    done: dict[str, Any] = {}

    def settled() -> bool:
        done.update(cp.admin.get(path).json())
        return done["state"] in ("complete", "failed")

    wait_until(settled, timeout_s=60, what=f"request {doc['id']} answered")
    return done


def fetch(cp: RunningControlPlane, doc: dict[str, Any]) -> bytes:
    done = answered(cp, doc)
    assert done["state"] == "complete", done
    data = cp.admin.get(f"/api/v1/devices/{DEVICE}/diagnostics/{doc['id']}/data")
    assert data.status_code == 200, data.text
    assert len(data.content) == done["received_bytes"] == done["total_bytes"]
    return data.content


def test_logs_and_bundle_arrive_capped_and_without_secrets(
    cp: RunningControlPlane,
    broker: Mosquitto,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    root_logging: None,
) -> None:
    write_example_repository(tmp_path / "examples", models=("mlp",))
    repo = copy_models(tmp_path / "examples", tmp_path / "repo", "mlp")
    monkeypatch.setenv("EDGEFLEET_AGENT_API_KEY", API_KEY)
    fleet = FleetSettings(
        mqtt_url=broker.url,
        device_id=DEVICE,
        username="logs-box",
        password=SecretStr(BROKER_PASSWORD),
        state_dir=tmp_path / "state",
        trust_root_file=cp.trust_root_file,
        telemetry_interval_s=0.5,
        telemetry_resend_s=1.0,
        reconnect_min_s=0.05,
    )
    with serve(repo, fleet=fleet) as agent:
        configure_agent_logging(agent.state.settings)
        assert agent.state.settings.api_key is not None  # the planted env var was read
        wait_until(
            lambda: cp.admin.get(f"/api/v1/devices/{DEVICE}").status_code == 200,
            what="the device in the inventory",
        )
        log = logging.getLogger("edgefleet.agent.test")
        # a line that carries a secret, as a careless one would: it is written redacted
        log.warning("careless line", extra={"password": BROKER_PASSWORD, "key": API_KEY})
        # a forged command (a key the device does not trust) and an unsigned one: refused
        topics, now = Topics(), datetime.now(UTC)
        forged = Command(
            command_id="forged-1",
            device_id=DEVICE,
            type=CommandType.LOGS,
            issued_at=now,
            expires_at=now + timedelta(hours=1),
        )
        envelope = sign_envelope(forged.model_dump(mode="json"), SigningKey.generate())
        publish(broker, topics.commands(DEVICE), envelope.model_dump_json().encode())
        publish(broker, topics.commands(DEVICE), forged.model_dump_json().encode())
        client = agent.state.fleet
        assert client is not None
        rejected = client.metrics.fleet_rejected
        wait_until(
            lambda: (
                rejected.labels("commands", "unknown_key")._value.get() == 1
                and rejected.labels("commands", "malformed")._value.get() == 1
            ),
            what="both commands refused",
        )
        assert client.diagnostics._answer is None and not client.diagnostics._requests
        for i in range(2500):  # ~300 KB of lines: the answer takes several chunks
            log.info("filler line %d", i, extra={"pad": "x" * 64})
        log.warning("the newest line", extra={"marker": "last-marker"})
        until = datetime.now(UTC).isoformat()

        # logs through the API, newest that fit 256 KiB: several acknowledged chunks
        asked = cp.admin.post(f"/api/v1/devices/{DEVICE}/logs", json={"max_bytes": 262144})
        assert asked.status_code == 202, asked.text
        lines = fetch(cp, asked.json()).decode().splitlines()
        assert 0 < len(lines) < 2600 and sum(len(x) + 1 for x in lines) <= 262144
        messages = [json.loads(x)["message"] for x in lines]
        assert "the newest line" in messages and "filler line 0" not in messages  # the newest

        # WARNING and up, all of them: the refusals and the careless line, redacted
        asked = cp.admin.post(
            f"/api/v1/devices/{DEVICE}/logs", json={"level": "WARNING", "max_bytes": 4 * 2**20}
        )
        warned = fetch(cp, asked.json())
        records = [json.loads(x) for x in warned.splitlines()]
        assert {r["level"] for r in records} <= {"WARNING", "ERROR"}
        refused = [r for r in records if r["message"] == "message rejected"]
        assert {r["code"] for r in refused} >= {"unknown_key", "malformed"}, refused
        careless = [r for r in records if r["message"] == "careless line"]
        assert careless and careless[0]["password"] == careless[0]["key"] == "[redacted]"

        # the size cap: a small one holds
        # the size cap: a small one holds, the newest lines up to ``until`` kept
        asked = cp.admin.post(
            f"/api/v1/devices/{DEVICE}/logs", json={"max_bytes": 600, "until": until}
        )
        small = fetch(cp, asked.json())
        assert 0 < len(small) <= 600 and small.splitlines()[-1].find(b"last-marker") > 0, small

        # the support bundle, through the CLI
        out = tmp_path / "bundle.json"
        run = edgefleet(cp, "devices", "support-bundle", DEVICE, "-o", str(out))
        assert run.returncode == 0, run.stderr
        bundle_bytes = out.read_bytes()
        bundle = json.loads(bundle_bytes)
        assert bundle["device_id"] == DEVICE
        assert {"model": "mlp", "versions": [1]} in bundle["served"]
        assert "edgefleet_" in bundle["metrics"] and "# TYPE" in bundle["metrics"]
        assert {"pending", "bytes", "last_telemetry_seq"} <= set(bundle["outbox"])
        assert bundle["config"]["fleet"]["password"] == "[redacted]"
        assert bundle["config"]["api_key"] == "[redacted]"
        assert bundle["config"]["fleet"]["device_id"] == DEVICE
        assert any(r.get("marker") == "last-marker" for r in bundle["logs"])

        # a bundle's cap holds too: fewer log lines, still one JSON document
        asked = cp.admin.post(f"/api/v1/devices/{DEVICE}/support-bundle", json={"max_bytes": 24000})
        capped_bytes = fetch(cp, asked.json())
        capped = json.loads(capped_bytes)
        assert len(capped_bytes) <= 24000 and 0 < len(capped["logs"]) < len(bundle["logs"])

        # the logs through the CLI, to a file
        cli_out = tmp_path / "logs.jsonl"
        run = edgefleet(
            cp,
            "devices",
            "logs",
            DEVICE,
            "--since",
            "10m",
            "--level",
            "WARNING",
            "-o",
            str(cli_out),
        )
        assert run.returncode == 0, run.stderr
        assert b"message rejected" in cli_out.read_bytes()

    everything = [
        bundle_bytes,
        capped_bytes,
        warned,
        cli_out.read_bytes(),
        small,
        "\n".join(lines).encode(),
    ]
    for data in everything:
        assert BROKER_PASSWORD.encode() not in data and API_KEY.encode() not in data
    # nor in what the control plane stored for any request, nor in the device's own log file
    listed = cp.admin.get(f"/api/v1/devices/{DEVICE}/diagnostics").json()["requests"]
    assert len(listed) == 6 and {r["state"] for r in listed} == {"complete"}
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "state" / "logs").iterdir())
    assert b"careless line" in on_disk and BROKER_PASSWORD.encode() not in on_disk


def test_viewers_may_not_ask_nor_read_and_bad_input_names_the_field(
    cp: RunningControlPlane,
) -> None:
    with cp.client(cp.token("viewer", "logs-viewer")) as viewer:
        asked = viewer.post(f"/api/v1/devices/{DEVICE}/logs", json={})
        assert asked.status_code == 403, asked.text
        listed = viewer.get(f"/api/v1/devices/{DEVICE}/diagnostics")
        assert listed.status_code == 403, listed.text
    bad = cp.admin.post(f"/api/v1/devices/{DEVICE}/logs", json={"max_bytes": 0})
    assert bad.status_code in (400, 422) and "max_bytes" in bad.text, bad.text
    naive = cp.admin.post(f"/api/v1/devices/{DEVICE}/logs", json={"since": "2026-01-01T00:00:00"})
    assert naive.status_code in (400, 422) and "since" in naive.text, naive.text
    unknown = cp.admin.post("/api/v1/devices/no-such-box/logs", json={})
    assert unknown.status_code == 404, unknown.text
    missing = cp.admin.get(f"/api/v1/devices/{DEVICE}/diagnostics/nope")
    assert missing.status_code == 404, missing.text
