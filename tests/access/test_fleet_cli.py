"""``edgefleet fleet`` as an operator runs it: issue device passwords, write the broker's
configuration, start Mosquitto from that file unchanged, revoke a device."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from control_plane.main import with_broker_password
from control_plane.provisioning.acl import CONTROL_PLANE_USER
from control_plane.settings import ControlPlaneSettings, load_settings
from tests.access.mqtt_client import NOT_AUTHORIZED, ProbeClient
from tests.agent.server import wait_until
from tests.agent.test_cli import edgefleet
from tests.mqtt_broker import free_port

T = "edgefleet/devices"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


@pytest.mark.slow
def test_issue_write_run_and_revoke(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    state, out, port = tmp_path / "cp-state", tmp_path / "broker", free_port()
    common = ["--state-dir", str(state)]
    pw_a = edgefleet("fleet", "add-device", "dev-a", *common).stdout.strip()
    pw_b = edgefleet("fleet", "add-device", "dev-b", *common).stdout.strip()
    assert len(pw_a) >= 40 and pw_a != pw_b
    bad = edgefleet("fleet", "add-device", "edgefleet-control-plane", *common, check=False)
    assert bad.returncode != 0 and "reserved" in bad.stderr
    owner = pwd.getpwuid(os.geteuid()).pw_name  # the user mosquitto runs as, here ourselves
    write_config = ["fleet", "mosquitto-config", "--out", str(out), "--port", str(port)]
    # (port + 1, the default, is often an outgoing connection's here: bind(0) picks odd ports)
    cp_port = free_port()
    local = ["--bind", "127.0.0.1", "--owner", owner, "--control-plane-port", str(cp_port)]
    written = edgefleet(*write_config, *local, "--dashboard", *common)
    assert f"wrote {out / 'mosquitto.conf'}" in written.stdout
    assert pw_a not in (out / "passwd").read_text()
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    command = [mosquitto, "-c", str(out / "mosquitto.conf")]
    started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_until(lambda: _accepts(port), what="the broker from the generated config")

    a = ProbeClient(port, username="dev-a", password=pw_a)
    dashboard_password = (state / "mqtt" / "edgefleet-dashboard.password").read_text()
    dashboard = ProbeClient(port, username="edgefleet-dashboard", password=dashboard_password)
    cp_login = {
        "username": "edgefleet-control-plane",
        "password": (state / "mqtt" / "edgefleet-control-plane.password").read_text(),
    }
    # the control plane's credentials: refused to a second client on the devices' listener
    # (issue 47: a dashboard with them took over its session once a second), taken on its own
    second, own = ProbeClient(port, **cp_login), ProbeClient(cp_port, **cp_login)
    try:
        assert second.connect() == NOT_AUTHORIZED and own.connect() == 0
    finally:
        second.close()
        own.close()
    try:
        assert a.connect() == 0 and dashboard.connect() == 0
        assert a.publish(f"{T}/dev-b/status", b"as b").value == NOT_AUTHORIZED
        # the dashboard reads device reports and writes nothing
        dashboard.subscribe(f"{T}/+/telemetry")
        assert a.publish(f"{T}/dev-a/telemetry", b"mine").value == 0
        dashboard.wait(lambda: dashboard.messages(f"{T}/dev-a/telemetry"), "dev-a's telemetry")
        assert dashboard.publish(f"{T}/dev-a/desired", b"forged").value == NOT_AUTHORIZED
    finally:
        a.close()
        dashboard.close()

    revoked = edgefleet("fleet", "revoke-device", "dev-b", *common)
    assert revoked.stdout.strip() == "dev-b: password removed, 0 certificate(s) revoked"
    again = edgefleet("fleet", "revoke-device", "dev-b", *common, check=False)
    assert again.returncode != 0 and "no credentials for device dev-b" in again.stderr
    edgefleet(*write_config, *local, *common)
    started[0].send_signal(signal.SIGHUP)

    def b_refused() -> bool:
        probe = ProbeClient(port, username="dev-b", password=pw_b)
        try:
            return probe.connect() == NOT_AUTHORIZED
        finally:
            probe.close()

    wait_until(b_refused, what="dev-b to be refused")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "written"),
    [
        ((), False),  # the default bind, 0.0.0.0, without TLS
        (("--bind", "192.0.2.10"), False),
        (("--bind", "broker.example"), False),  # a name is not known to stay local
        (("--bind", "127.0.0.1"), True),
        (("--bind", "::1"), True),
        (("--allow-plaintext",), True),
        (("--tls",), True),
    ],
)
def test_a_plaintext_broker_on_the_network_needs_saying_so(
    tmp_path: Path, flags: tuple[str, ...], written: bool
) -> None:
    """Device passwords travel in every CONNECT: without TLS the broker listens beyond
    loopback only when told that the network is trusted."""
    out = tmp_path / "broker"
    write_config = ["fleet", "mosquitto-config", "--out", str(out), *flags]
    result = edgefleet(*write_config, "--state-dir", str(tmp_path / "state"), check=False)
    assert (result.returncode == 0) is written, result.stderr
    assert (out / "mosquitto.conf").exists() is written
    if not written:
        assert "unencrypted" in result.stderr and "--tls" in result.stderr


# -- `fleet init`: the broker and the control plane from one command --------------------------


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user can reach: a Mosquitto started by root reads its files as the
    mosquitto user (pytest's own temporary directories are mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="edgefleet-fleet-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start_broker(
    conf: Path, log: Path, started: list[subprocess.Popen[bytes]], port: int
) -> subprocess.Popen[bytes]:
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with log.open("wb") as out:
        proc = subprocess.Popen([mosquitto, "-c", str(conf)], stdout=out, stderr=out)
    started.append(proc)
    wait_until(lambda: _accepts(port) or proc.poll() is not None, what="the broker")
    assert proc.poll() is None, log.read_text()
    return proc


def test_init_writes_a_broker_and_a_control_plane_that_logs_in(
    open_dir: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    fleet, mqtt_port, api_port = open_dir / "fleet", free_port(), free_port()
    cp_port = free_port()
    ports = ["--mqtt-port", str(mqtt_port), "--api-port", str(api_port)]
    ports += ["--control-plane-port", str(cp_port)]
    done = edgefleet("fleet", "init", str(fleet), *ports)
    token = (fleet / "operator-token").read_text().strip()
    assert token.startswith("efp_") and token in done.stdout  # printed, this once
    assert (fleet / "operator-token").stat().st_mode & 0o777 == 0o600
    assert (fleet / "control-plane" / "admin-token").stat().st_mode & 0o777 == 0o600
    settings = tomllib.loads((fleet / "control-plane.toml").read_text())
    password_file = Path(settings["mqtt_password_file"])
    assert password_file.stat().st_mode & 0o777 == 0o600
    assert password_file.read_text() not in (fleet / "control-plane.toml").read_text()
    assert settings["mqtt_username"] == CONTROL_PLANE_USER and "mqtt_password" not in settings
    # the control plane on its own listener, devices on theirs (client id = username)
    assert settings["mqtt_url"] == f"mqtt://127.0.0.1:{cp_port}"
    assert f'mqtt_url = "mqtt://127.0.0.1:{mqtt_port}"' in done.stdout
    conf = fleet / "broker" / "mosquitto.conf"
    assert "persistence true" in conf.read_text().splitlines()
    # the next commands, in the order they run
    # (whole commands: a temporary directory's random name may hold "-c" or "agent")
    steps = [
        "mosquitto -c",
        "edgefleet control-plane --config",
        "edgefleet fleet add-device",
        "kill -HUP",
        "edgefleet agent --config",
    ]
    positions = [done.stdout.index(step) for step in steps]
    assert positions == sorted(positions), done.stdout

    again = edgefleet("fleet", "init", str(fleet), *ports, check=False)
    assert again.returncode == 1 and "--force" in again.stderr
    assert (fleet / "operator-token").read_text().strip() == token  # untouched

    log = open_dir / "broker.log"
    _start_broker(conf, log, started, mqtt_port)
    cp_log = (open_dir / "control-plane.log").open("wb")
    exe = Path(sys.executable).parent / "edgefleet"
    command = [str(exe), "control-plane", "--config", str(fleet / "control-plane.toml")]
    started.append(subprocess.Popen(command, stdout=cp_log, stderr=cp_log))
    cp_log.close()

    def healthy() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{api_port}/health").json().get("mqtt") is True
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout_s=60, what="the control plane logged in to the broker")
    listed = httpx.get(
        f"http://127.0.0.1:{api_port}/api/v1/devices",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert listed.status_code == 200, listed.text
    # the broker said nothing of its config: no unreadable file, no ACL warning
    assert "Warning" not in log.read_text() and "Error" not in log.read_text(), log.read_text()

    forced = edgefleet("fleet", "init", str(fleet), *ports, "--force")
    new_token = (fleet / "operator-token").read_text().strip()
    assert new_token != token and new_token in forced.stdout


def test_broker_files_follow_the_devices_and_the_broker_user(
    open_dir: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    """Without --owner: run as root, the files go to the mosquitto user Mosquitto drops to;
    otherwise they stay ours. Devices issued or revoked later are written to the broker's
    files at once; a SIGHUP applies them."""
    state, out, port = open_dir / "state", open_dir / "broker", free_port()
    common = ["--state-dir", str(state)]
    cp_port = free_port()
    listener = ["--port", str(port), "--bind", "127.0.0.1", "--control-plane-port", str(cp_port)]
    edgefleet("fleet", "mosquitto-config", "--out", str(out), *listener, *common)
    conf = (out / "mosquitto.conf").read_text().splitlines()
    owner = "mosquitto" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    assert ("user mosquitto" in conf) is (os.geteuid() == 0)
    for name in ("passwd", "acl", "services.passwd", "services.acl", "mosquitto.conf", "data"):
        assert pwd.getpwuid((out / name).stat().st_uid).pw_name == owner, name
    log = open_dir / "broker.log"
    broker = _start_broker(out / "mosquitto.conf", log, started, port)
    assert "Warning" not in log.read_text(), log.read_text()

    added = edgefleet("fleet", "add-device", "dev-a", *common)
    password = added.stdout.strip()
    assert "kill -HUP" in added.stderr and "dev-a" in (out / "passwd").read_text()
    assert pwd.getpwuid((out / "passwd").stat().st_uid).pw_name == owner
    broker.send_signal(signal.SIGHUP)
    trust = "edgefleet/fleet/trust"
    publisher = ProbeClient(  # on its own listener
        cp_port,
        username=CONTROL_PLANE_USER,
        password=(state / "mqtt" / f"{CONTROL_PLANE_USER}.password").read_text(),
    )
    device = ProbeClient(port, username="dev-a", password=password)
    try:
        wait_until(lambda: device.connect() == 0, what="dev-a accepted after the reload")
        assert publisher.connect() == 0
        assert not publisher.publish(trust, b"root 2", retain=True).is_failure
        device.subscribe(trust)  # read by name, not by a pattern Mosquitto warns about
        device.wait(lambda: device.messages(trust), "the trust root")
    finally:
        device.close()
        publisher.close()

    edgefleet("fleet", "revoke-device", "dev-a", *common)
    assert "dev-a" not in (out / "passwd").read_text() + (out / "acl").read_text()
    assert "Warning" not in log.read_text() and "Error" not in log.read_text(), log.read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="the broker drops to another user only as root")
def test_a_directory_the_broker_user_cannot_reach_is_refused(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    refused = edgefleet("fleet", "init", str(closed / "fleet"), check=False)
    assert refused.returncode == 1
    assert refused.stderr.startswith("Error: the broker, running as mosquitto, could not reach")
    assert not (closed / "fleet" / "broker").exists()  # nothing written


def test_an_unreadable_password_file_stops_the_control_plane_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.password"
    db = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
    run = edgefleet("control-plane", "--db", db, "--mqtt-password-file", str(missing), check=False)
    assert run.returncode == 1
    assert run.stderr.strip() == f"Error: mqtt_password_file {missing}: No such file or directory"


def test_the_password_file_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "cp.password"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("EDGEFLEET_CP_MQTT_PASSWORD_FILE", str(secret))
    settings = ControlPlaneSettings()
    assert settings.mqtt_password_file == secret
    password = with_broker_password(settings).mqtt_password
    assert password is not None and password.get_secret_value() == "s3cret"
    toml = tmp_path / "cp.toml"
    toml.write_text(f'mqtt_password_file = "{secret}"\n')
    monkeypatch.delenv("EDGEFLEET_CP_MQTT_PASSWORD_FILE")
    assert load_settings(toml).mqtt_password_file == secret
    with pytest.raises(ValidationError, match="not both") as refused:
        load_settings(toml, mqtt_password="inline-4b1d9e")
    assert "inline-4b1d9e" not in str(refused.value)  # the error shows no input


@pytest.mark.parametrize(
    "args",
    [
        ("init", "{dir}", "--mqtt-port", "18830", "--control-plane-port", "18830"),
        ("mosquitto-config", "--out", "{dir}", "--port", "65535", "--bind", "127.0.0.1")
        + ("--state-dir", "{dir}-state"),
    ],
)
def test_the_control_plane_listener_needs_a_port_of_its_own(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    out = tmp_path / "fleet"
    result = edgefleet("fleet", *(a.format(dir=out) for a in args), check=False)
    assert result.returncode == 2 and "--control-plane-port" in result.stderr, result.stderr
    assert not out.exists()  # refused before anything was written
