"""``edgefleet fleet`` as an operator runs it: issue device passwords, write the broker's
configuration, start Mosquitto from that file unchanged, revoke a device."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    local = ["--bind", "127.0.0.1", "--owner", owner]
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
