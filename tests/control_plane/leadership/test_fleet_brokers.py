"""The brokers ``edgefleet fleet`` writes host control plane replicas (issue 47): two replicas
on PostgreSQL, each its own client id, one shared subscription group, on the broker started
from the files ``fleet init`` wrote (password file) and from ``fleet dynsec-config`` (the
plugin), as the docs set them up. Both stay healthy with no session taken over; devices
enrolling at both at once all keep a working account, a device asking twenty times at once
gets one password; the leader is visible; a client that steals a replica's client id is
told in one line a takeover, not fought every 0.2 s."""

from __future__ import annotations

import contextlib
import subprocess
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from control_plane.provisioning.acl import DASHBOARD_USER
from tests.access.mqtt_client import NOT_AUTHORIZED, ProbeClient
from tests.agent.server import wait_until
from tests.agent.test_cli import edgefleet
from tests.control_plane.enrolment.conftest import postgresql_database
from tests.control_plane.leadership.brokers import broker_from, dynsec_broker
from tests.control_plane.leadership.processes import Replica, replica
from tests.mqtt_broker import free_port

pytestmark = pytest.mark.slow

T = "edgefleet/devices"
STEADY_S = 5.0


@contextlib.contextmanager
def two_replicas(
    state_dir: Path, db_url: str, mqtt_url: str, env: dict[str, str]
) -> Iterator[tuple[Replica, Replica]]:
    ports = free_port(), free_port()
    with contextlib.ExitStack() as stack:
        a, b = (
            stack.enter_context(
                replica(name, state_dir, db_url, mqtt_url, port, f"http://127.0.0.1:{port}", env)
            )
            for name, port in zip(("cp-a", "cp-b"), ports, strict=True)
        )
        yield a, b


def stay_healthy(replicas: tuple[Replica, ...], seconds: float = STEADY_S) -> None:
    """Every replica's /health is 200 with mqtt true at every look for ``seconds``."""
    wait_until(lambda: all(_health(r)[0] == 200 for r in replicas), what="healthy replicas")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for r in replicas:
            status, body = _health(r)
            assert status == 200 and body["mqtt"] is True, (r.name, body, r.log.read_text()[-3000:])
        time.sleep(0.25)


def _health(r: Replica) -> tuple[int, dict[str, object]]:
    try:
        resp = httpx.get(f"{r.url}/health", timeout=5)
    except httpx.HTTPError:
        return 0, {}
    return resp.status_code, resp.json()


def leader_is_visible(a: Replica, b: Replica) -> None:
    """Both replicas name the same leader and epoch; it is one of them; /metrics says so."""

    def agreed() -> bool:
        la, lb = (_health(r)[1].get("leader") or {} for r in (a, b))
        assert isinstance(la, dict) and isinstance(lb, dict)
        seen = {(x.get("id"), x.get("epoch")) for x in (la, lb)}
        return len(seen) == 1 and None not in seen.pop()

    wait_until(agreed, what="both replicas to see the leader")
    la, lb = (_health(r)[1]["leader"] for r in (a, b))
    assert isinstance(la, dict) and isinstance(lb, dict)
    assert (la["id"], la["epoch"]) == (lb["id"], lb["epoch"]) and la["epoch"] >= 1
    assert [la["this_replica"], lb["this_replica"]].count(True) == 1
    lead = a if la["this_replica"] else b
    assert str(la["id"]).startswith(f"edgefleet-{lead.name}:")
    metrics = lead.admin.get("/metrics").text
    assert f'edgefleet_leader_epoch{{leader="{la["id"]}"}} {float(la["epoch"])}' in metrics
    assert "edgefleet_leading 1.0" in metrics


def enrol_at_once(a: Replica, b: Replica, token: str) -> tuple[dict[str, str], set[str]]:
    """Ten devices through each replica, and one device twenty times (ten at each), all at
    once; each device's password, and the distinct passwords the repeated one got."""

    def post(cp: Replica, device_id: str) -> httpx.Response:
        body = {
            "device_id": device_id,
            "device_key": f"key-of-{device_id}-" + "x" * 32,
            "hardware_profile": "raspberry-pi-5",
        }
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.post(f"{cp.url}/api/v1/enrol", json=body, headers=headers, timeout=60)

    calls = [(a, f"dev-a{i}") for i in range(10)] + [(b, f"dev-b{i}") for i in range(10)]
    calls += [(a if i % 2 else b, "dev-same") for i in range(20)]
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(lambda call: post(*call), calls))
    for (_, device_id), resp in zip(calls, answers, strict=True):
        assert resp.status_code == 201, (device_id, resp.text)
    passwords = {d: r.json()["password"] for (_, d), r in zip(calls, answers, strict=True)}
    same = {
        r.json()["password"] for (_, d), r in zip(calls, answers, strict=True) if d == "dev-same"
    }
    return passwords, same


def every_device_logs_in(port: int, passwords: dict[str, str], client_id: str = "{}") -> None:
    for device_id, password in passwords.items():
        probe = ProbeClient(
            port, username=device_id, password=password, client_id=client_id.format(device_id)
        )
        try:
            wait_until(lambda p=probe: p.connect() == 0, what=f"{device_id} to log in")
        finally:
            probe.close()


def claim(cp: Replica) -> str:
    resp = cp.admin.post("/api/v1/claims", json={"name": "line-1", "max_uses": 100})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["token"])


def test_two_replicas_on_the_broker_fleet_init_writes(open_dir: Path) -> None:
    fleet, device_port, cp_port = open_dir / "fleet", free_port(), free_port()
    with postgresql_database() as db_url:
        args = ["--mqtt-port", str(device_port), "--control-plane-port", str(cp_port)]
        done = edgefleet("fleet", "init", str(fleet), *args, "--db", db_url)
        settings = tomllib.loads((fleet / "control-plane.toml").read_text())
        env = {
            "EDGEFLEET_CP_MQTT_USERNAME": settings["mqtt_username"],
            "EDGEFLEET_CP_MQTT_PASSWORD_FILE": settings["mqtt_password_file"],
        }
        log = open_dir / "broker.log"
        conf = fleet / "broker" / "mosquitto.conf"
        with (
            broker_from(conf, log, device_port),
            two_replicas(fleet / "control-plane", db_url, settings["mqtt_url"], env) as (a, b),
        ):
            stay_healthy((a, b))
            leader_is_visible(a, b)
            passwords, same = enrol_at_once(a, b, claim(a))
            assert len(same) == 1  # twenty answers, one password
            every_device_logs_in(device_port, passwords)
            dashboard_reads_and_writes_nothing(done.stdout, device_port, passwords)
            # the control plane's login, tried on the devices' listener (where a dashboard
            # would): refused, and both replicas untouched
            login = {
                "username": settings["mqtt_username"],
                "password": Path(settings["mqtt_password_file"]).read_text(),
            }
            second = ProbeClient(device_port, **login)
            try:
                assert second.connect() == NOT_AUTHORIZED
            finally:
                second.close()
            stay_healthy((a, b), seconds=1.0)
            assert "already connected" not in log.read_text(), log.read_text()[-3000:]
            a_stolen_client_id_is_said_once_and_not_fought(cp_port, a, b, settings, log)


def dashboard_reads_and_writes_nothing(
    printed: str, device_port: int, passwords: dict[str, str]
) -> None:
    """The read-only account ``fleet init`` printed: device telemetry, and nothing written."""
    line = next(x for x in printed.splitlines() if "mosquitto_sub" in x)
    assert f"-u {DASHBOARD_USER}" in line and f"-p {device_port}" in line
    password_file = line.split('"$(cat ')[1].split(')"')[0]
    dashboard = ProbeClient(
        device_port, username=DASHBOARD_USER, password=Path(password_file).read_text()
    )
    device = ProbeClient(device_port, username="dev-a0", password=passwords["dev-a0"])
    try:
        assert dashboard.connect() == 0 and device.connect() == 0
        dashboard.subscribe(f"{T}/+/telemetry")
        assert device.publish(f"{T}/dev-a0/telemetry", b"{}").value == 0
        dashboard.wait(lambda: dashboard.messages(f"{T}/dev-a0/telemetry"), "the telemetry")
        for leaf in ("desired", "commands", "telemetry"):
            assert dashboard.publish(f"{T}/dev-a0/{leaf}", b"x").value == NOT_AUTHORIZED
    finally:
        dashboard.close()
        device.close()


def a_stolen_client_id_is_said_once_and_not_fought(
    cp_port: int, a: Replica, b: Replica, settings: dict[str, str], log: Path
) -> None:
    """A ``mosquitto_sub`` logging in with replica a's client id, reconnecting whenever it is
    thrown out (issue 47: 1,031 takeovers in 11 minutes): a says so, naming the reason, and
    backs off (2, 4, 8 s ...) rather than taking the session back every 0.2 s; b is untouched."""
    password = Path(settings["mqtt_password_file"]).read_text()
    before = log.read_text().count("already connected")
    thief = subprocess.Popen(
        ["mosquitto_sub", "-p", str(cp_port), "-i", "edgefleet-cp-a", "-V", "mqttv5", "-t", "x"]
        + ["-u", settings["mqtt_username"], "-P", password],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: "session taken over" in a.log.read_text(), what="a to say so")
        time.sleep(8.0)
    finally:
        thief.terminate()
        thief.wait(timeout=10)
    lines = [x for x in a.log.read_text().splitlines() if "session taken over" in x]
    assert "0x8E" in lines[0] and "'edgefleet-cp-a'" in lines[0]
    assert 1 <= len(lines) <= 4, lines  # 2 + 4 + 8 s of backoff (with jitter)
    takeovers = log.read_text().count("already connected") - before
    assert takeovers <= 10, takeovers  # about 1 a second for the thief's retries alone
    stay_healthy((b,), seconds=1.0)
    wait_until(lambda: _health(a)[0] == 200, timeout_s=60, what="a back once the thief left")


def test_two_replicas_on_the_dynsec_broker(open_dir: Path) -> None:
    """The broker directory ``fleet dynsec-config`` writes, run as docs/enrolment.md says."""
    with dynsec_broker(open_dir) as broker, postgresql_database() as db_url:
        replicas = two_replicas(broker.state_dir, db_url, broker.replica_url, broker.replica_env)
        with replicas as (a, b):
            stay_healthy((a, b))
            leader_is_visible(a, b)
            passwords, same = enrol_at_once(a, b, claim(b))
            assert len(same) == 1
            # the plugin binds each device's user to the agent's client id
            every_device_logs_in(broker.device_port, passwords, client_id="edgefleet-agent-{}")
            # the replicas' login on the devices' listener: refused, both replicas untouched
            env = broker.replica_env
            second = ProbeClient(
                broker.device_port,
                username=env["EDGEFLEET_CP_MQTT_USERNAME"],
                password=Path(env["EDGEFLEET_CP_MQTT_PASSWORD_FILE"]).read_text(),
            )
            try:
                assert second.connect() == NOT_AUTHORIZED
            finally:
                second.close()
            stay_healthy((a, b), seconds=1.0)
        log = broker.log()
        assert "already connected" not in log, log[-3000:]
