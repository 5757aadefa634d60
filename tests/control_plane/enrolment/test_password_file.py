"""Enrolment with the broker of ``edgefleet fleet`` (password file and ACL, no plugin): the
control plane writes the device's password hash and the ACL into the broker's directory and
has the broker reread them (SIGHUP); the device then logs in, confined to its own topics."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.protocol.topics import Topics
from control_plane.mqtt.codec import MqttError
from control_plane.mqtt.wire import Connection, connect
from control_plane.provisioning.acl import CONTROL_PLANE_USER
from control_plane.provisioning.mosquitto import FleetAccess
from tests.control_plane.enrolment.conftest import enrol, new_claim
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.control_plane.test_mqttwire import Inbox, close_and_wait
from tests.mqtt_broker import free_port


@pytest.fixture
def fleet_broker(tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    """The broker of ``edgefleet fleet mosquitto-config``, run from the files it wrote."""
    port, cp_port = free_port(), free_port()  # the devices' listener, the control plane's
    owner = "root" if os.geteuid() == 0 else None  # as tests/mqtt_broker.py: keep our user
    conf = FleetAccess(tmp_path / "cp-state").write_config(
        tmp_path / "broker", port=port, bind="127.0.0.1", owner=owner, control_plane_port=cp_port
    )
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = subprocess.Popen([exe, "-c", str(conf)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:  # ready when the port accepts
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "mosquitto did not start"
            time.sleep(0.02)
    yield port, cp_port, tmp_path / "cp-state"
    proc.terminate()
    proc.wait(timeout=20)


@pytest.mark.slow
def test_password_file_enrolment_reloads_the_broker(
    tmp_path: Path, fleet_broker: tuple[int, int, Path]
) -> None:
    port, cp_port, state_dir = fleet_broker
    service = FleetAccess(state_dir).service(CONTROL_PLANE_USER)
    with control_plane(
        state_dir,
        f"sqlite+aiosqlite:///{tmp_path}/cp.db",
        f"mqtt://127.0.0.1:{cp_port}",
        free_port(),
        mqtt_username=CONTROL_PLANE_USER,
        mqtt_password_file=service.password_file,
    ) as cp:
        password = _enrolled(cp, "dev-f")
        _check_login(port, password)
        # rejected: its hash leaves the password file, and the broker rereads it
        resp = cp.admin.post("/api/v1/enrolments/dev-f/reject", json={"reason": "lost"})
        assert resp.status_code == 200, resp.text
    assert "dev-f:" not in (tmp_path / "broker" / "passwd").read_text()

    async def refused() -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                conn = await connect(
                    "127.0.0.1", port, "dev-f", Inbox(), username="dev-f", password=password
                )
            except MqttError as exc:
                assert "0x87" in str(exc) or "0x86" in str(exc), exc
                return
            await close_and_wait(conn)
            assert time.monotonic() < deadline, "the broker still takes the rejected login"
            await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(refused(), 60))


def _check_login(port: int, password: str) -> None:
    topics = Topics()

    async def login() -> Connection:
        deadline = time.monotonic() + 10
        while True:  # the broker rereads its files on the SIGHUP, soon after
            try:
                return await connect(
                    "127.0.0.1", port, "dev-f", Inbox(), username="dev-f", password=password
                )
            except MqttError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def scenario() -> None:
        conn = await login()
        await conn.publish(topics.telemetry("dev-f"), b"{}")
        with pytest.raises(MqttError, match="0x87 not authorized"):
            await conn.publish(topics.telemetry("dev-g"), b"{}")
        await close_and_wait(conn)

    asyncio.run(asyncio.wait_for(scenario(), 60))


def _enrolled(cp: RunningControlPlane, device_id: str) -> str:
    resp = enrol(cp, new_claim(cp), device_id)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["password"])
