"""Enrolment fixtures: the broker ``fleet dynsec-config`` writes (the dynamic security plugin
for the devices, the control plane on a listener of its own), a control plane that creates
device users in it, and agents that start with nothing but a claim token."""

from __future__ import annotations

import contextlib
import os
import pwd
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner

from agent.fleet.settings import FleetSettings
from common.cli import root
from control_plane.provisioning.acl import CONTROL_PLANE_USER
from control_plane.provisioning.dynsec_broker import find_plugin
from control_plane.provisioning.mosquitto import FleetAccess
from control_plane.settings.enrolment import AccountsKind, EnrolmentSettings
from tests.agent.server import RunningAgent, copy_models, serve
from tests.control_plane.conftest import PG_ADMIN
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import WrittenMosquitto, free_port


def dynsec_plugin() -> str:
    """The plugin of Debian's mosquitto package (``dpkg -L mosquitto | grep dynamic``)."""
    found = find_plugin()
    if found is None:
        pytest.skip("no mosquitto_dynamic_security.so here (Debian's mosquitto package has it)")
    return str(found)


def write_dynsec_broker(out: Path, state_dir: Path, *args: str) -> WrittenMosquitto:
    """``edgefleet fleet dynsec-config --out OUT`` on free ports, as docs/enrolment.md runs
    it; the broker not started yet."""
    dynsec_plugin()
    port, cp_port = free_port(), free_port()
    owner = pwd.getpwuid(os.geteuid()).pw_name  # as root: stay root, the files are its
    cli = ["fleet", "dynsec-config", "--out", str(out), "--state-dir", str(state_dir)]
    cli += ["--port", str(port), "--control-plane-port", str(cp_port), "--owner", owner, *args]
    result = CliRunner().invoke(root(), cli, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    conf = out / "mosquitto.conf"
    return WrittenMosquitto(conf, port=port, control_plane_port=cp_port, log_path=out / "log")


@pytest.fixture
def dynsec_broker(tmp_path: Path) -> Iterator[WrittenMosquitto]:
    """The broker ``edgefleet fleet dynsec-config`` writes, run from its files unchanged."""
    broker = write_dynsec_broker(tmp_path / "broker", tmp_path / "cp-state").start()
    yield broker
    broker.stop()


@pytest.fixture
def cp(
    request: pytest.FixtureRequest, tmp_path: Path, dynsec_broker: WrittenMosquitto
) -> Iterator[RunningControlPlane]:
    """On SQLite; on PostgreSQL too for a test parametrized with ``("cp", ["sqlite",
    "postgresql"], indirect=True)``."""
    with contextlib.ExitStack() as stack:
        db_url = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
        if getattr(request, "param", "sqlite") == "postgresql":
            db_url = stack.enter_context(postgresql_database())
        running = stack.enter_context(_control_plane(tmp_path, db_url, dynsec_broker))
        yield running


@contextlib.contextmanager
def postgresql_database() -> Iterator[str]:
    name = f"edgefleet_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def _control_plane(
    tmp_path: Path, db_url: str, dynsec_broker: WrittenMosquitto
) -> Iterator[RunningControlPlane]:
    with control_plane(
        tmp_path / "cp-state",
        db_url,
        dynsec_broker.control_plane_url,
        free_port(),
        mqtt_username=CONTROL_PLANE_USER,
        mqtt_password_file=FleetAccess(tmp_path / "cp-state").service().password_file,
        enrolment=EnrolmentSettings(accounts=AccountsKind.DYNSEC, pending_retry_s=0.2),
        deployment_tick_s=0.2,
    ) as running:
        yield running


def new_claim(cp: RunningControlPlane, **spec: Any) -> str:
    resp = cp.admin.post("/api/v1/claims", json={"name": "factory", **spec})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["token"])


ClaimedAgent = Callable[..., AbstractContextManager[RunningAgent]]


@pytest.fixture
def claimed_agent(
    example_repo: Path, tmp_path: Path, dynsec_broker: WrittenMosquitto, cp: RunningControlPlane
) -> ClaimedAgent:
    """An agent with no broker login and no trust root: only the control plane's URL and a
    claim token."""

    def start(device_id: str, token: str, **overrides: Any) -> AbstractContextManager[RunningAgent]:
        repo = tmp_path / f"repo-{device_id}"
        if not repo.exists():
            copy_models(example_repo, repo, "mlp")
        fleet = FleetSettings(
            mqtt_url=dynsec_broker.url,
            device_id=device_id,
            state_dir=tmp_path / f"state-{device_id}",
            enrol_url=cp.url,
            claim_token=token,
            telemetry_interval_s=0.2,
            reconnect_min_s=0.05,
            reconnect_max_s=0.5,
            **overrides,
        )
        return serve(repo, profile="raspberry-pi-5", fleet=fleet)

    return start


def enrol(cp: RunningControlPlane, token: str, device_id: str, **fields: Any) -> httpx.Response:
    body = {
        "device_id": device_id,
        "device_key": f"key-of-{device_id}-" + "x" * 32,
        "hardware_profile": "raspberry-pi-5",
        **fields,
    }
    with httpx.Client(base_url=cp.url, timeout=30) as client:
        return client.post("/api/v1/enrol", json=body, headers={"Authorization": f"Bearer {token}"})
