"""sd_notify: a real AF_UNIX datagram socket stands in for systemd's notify socket, and a real
agent process (``edgefleet agent``) reports READY=1, WATCHDOG=1 and STOPPING=1 to it."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.main import build_state
from agent.serving.state import ServingState
from agent.settings import AgentSettings
from agent.systemd import SystemdNotifier, notify_address
from tests.agent.process import agent_process
from tests.agent.server import copy_models, wait_until


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket under a short directory (AF_UNIX paths stop at 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="sd-") as directory:
        path = os.path.join(directory, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        # an upper bound on each wait, not a timing assertion: the loop below reads until
        # the message it needs arrives
        sock.settimeout(60)
        try:
            yield sock, path
        finally:
            sock.close()


def receive_until(sock: socket.socket, key: str, seen: list[dict[str, str]]) -> dict[str, str]:
    """Read datagrams (recording each in ``seen``) until one carries ``key``."""
    while True:
        fields = dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())
        seen.append(fields)
        if key in fields:
            return fields


@pytest.fixture
def idle_state(tmp_path: Path) -> ServingState:
    (tmp_path / "empty-repo").mkdir()
    return build_state(AgentSettings(model_repository=tmp_path / "empty-repo"))


def test_agent_process_notifies_ready_watchdog_and_stopping(
    example_repo: Path, tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    # 0.4 s timeout: a ping every 0.2 s
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
    with agent_process("--model-repository", str(repo), "--port", "0", env=env) as agent:
        seen: list[dict[str, str]] = []
        ready = receive_until(sock, "READY", seen)
        assert ready == {"READY": "1", "STATUS": "ready: 1 of 1 models serving"}
        # READY=1 came after the model loaded and while the server accepts connections
        assert httpx.get(f"{agent.address}/v2/health/ready").status_code == 200
        pings = 0
        while pings < 3:
            pings += receive_until(sock, "WATCHDOG", seen)["WATCHDOG"] == "1"
        assert sum("READY" in fields for fields in seen) == 1  # READY=1 is sent once

        agent.proc.send_signal(signal.SIGTERM)
        stopping = receive_until(sock, "STOPPING", seen)
        assert stopping == {"STOPPING": "1", "STATUS": "shutting down"}
        assert agent.proc.wait(timeout=60) == 0


def test_agent_serves_when_the_notify_socket_is_gone(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    env = {"NOTIFY_SOCKET": str(tmp_path / "nobody-listens"), "WATCHDOG_USEC": "400000"}
    with agent_process("--model-repository", str(repo), "--port", "0", env=env) as agent:

        def failed(message: str) -> bool:
            return any(
                line.get("message") == "sd_notify failed" and message in str(line.get("sent"))
                for line in agent.logs
            )

        wait_until(lambda: failed("READY=1"), what="a failed READY=1")
        wait_until(lambda: failed("WATCHDOG=1"), what="a failed WATCHDOG=1")
        resp = httpx.post(
            f"{agent.address}/v1/models/mlp:predict", json={"instances": [[0.0] * 256]}
        )
        assert resp.status_code == 200
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=60) == 0


def test_abstract_namespace_socket_and_environment_unset(idle_state: ServingState) -> None:
    name = f"edgefleet-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(60)
        environ = {"NOTIFY_SOCKET": f"@{name}", "WATCHDOG_USEC": "2000000", "PATH": "/bin"}
        environ["WATCHDOG_PID"] = str(os.getpid())
        notifier = SystemdNotifier.from_environment(environ, idle_state)
        assert notifier is not None
        assert environ == {"PATH": "/bin"}  # unset, so child processes do not inherit them
        assert notifier.watchdog_interval_s == 1.0
        notifier.tick()  # the start-up load has not finished: only the watchdog ping
        assert sock.recv(4096) == b"WATCHDOG=1"
        idle_state.loaded = True
        notifier.tick()
        # an empty repository: ready, as in Triton
        assert sock.recv(4096) == b"READY=1\nSTATUS=ready: 0 of 0 models serving"
        notifier.stopping()
        assert sock.recv(4096) == b"STOPPING=1\nSTATUS=shutting down"


def test_watchdog_meant_for_another_process_is_ignored(idle_state: ServingState) -> None:
    environ = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "2000000"}
    environ["WATCHDOG_PID"] = str(os.getpid() + 1)
    notifier = SystemdNotifier.from_environment(environ, idle_state)
    assert notifier is not None and notifier.watchdog_interval_s is None
    notifier.close()


@pytest.mark.parametrize(
    ("value", "address"),
    [("/run/systemd/notify", "/run/systemd/notify"), ("@sd", "\0sd"), ("vsock:2:1234", None)],
)
def test_notify_address_forms(value: str, address: str | None) -> None:
    assert notify_address(value) == address


def test_no_notifier_outside_systemd(idle_state: ServingState) -> None:
    assert SystemdNotifier.from_environment({"PATH": "/bin"}, idle_state) is None
    assert SystemdNotifier.from_environment({"NOTIFY_SOCKET": "vsock:2:9"}, idle_state) is None


def test_failed_send_is_reported_not_raised(idle_state: ServingState, tmp_path: Path) -> None:
    notifier = SystemdNotifier(str(tmp_path / "absent"), idle_state)
    assert notifier.send("READY=1") is False
    notifier.close()
