"""An agent that keeps exiting: the launcher backs off (doubling, capped), shows ``degraded``
with the last error in its journal and to systemd, never gives up, and takes a fix (a new
release) in the middle of a wait. And sd_notify upstream: READY=1 once its agent is ready,
WATCHDOG=1 from its own loop."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.launcher.harness import LauncherProcess, build_release, cli, free_port
from tests.agent.launcher.test_trial import FAST
from tests.agent.server import wait_until


def test_crash_loop_backs_off_and_reports_degraded(tmp_path: Path) -> None:
    port = free_port()
    broken = ["agent", "--model-repository", str(tmp_path / "no-such-repo"), "--port", str(port)]
    launcher = LauncherProcess(tmp_path / "launcher", port, dict(FAST), agent=broken).start()
    try:
        journal = launcher.wait(lambda j: j.exits_in_a_row >= 5, "five exits in a row")
        wait_until(lambda: len(launcher.messages("agent failed")) >= 5, what="five log lines")
        assert journal.phase == "degraded"
        assert journal.last_error is not None
        assert journal.last_error.startswith("crashed before ready (exit 1): Error: ")
        assert "no-such-repo" in journal.last_error
        waits = [m["restart_in_s"] for m in launcher.messages("agent failed")][:5]
        assert waits == [0.1, 0.2, 0.4, 0.4, 0.4]  # doubling from 0.1 s, capped at 0.4 s
        status = cli("launcher", "status", "--root", str(launcher.root)).stdout
        assert "current:  base (degraded)" in status
        assert "error:    crashed before ready (exit 1): Error: " in status
        # a fix arrives during a wait: taken at once, the crash loop ends
        done = cli(
            "launcher",
            "install",
            "--root",
            str(launcher.root),
            str(build_release(tmp_path, "2.0.0", "crashing")),
        )
        assert done.returncode == 0, done.stderr
        journal = launcher.wait(lambda j: j.last_outcome is not None, "the trial's outcome")
        assert journal.last_outcome is not None and journal.last_outcome.outcome == "rolled_back"
        assert launcher.journal().current == "base"  # still degraded, still trying
    finally:
        assert launcher.stop() == 0  # SIGTERM during a back-off ends it cleanly
    assert launcher.journal().phase == "stopped"


@pytest.fixture
def systemd_socket() -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket standing in for systemd's (AF_UNIX paths stop at 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="sd-") as directory:
        path = os.path.join(directory, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(60)  # a bound on each wait; the reads below wait for what they need
        try:
            yield sock, path
        finally:
            sock.close()


def receive_until(sock: socket.socket, key: str) -> dict[str, str]:
    while True:
        fields = dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())
        if key in fields:
            return fields


def test_launcher_tells_systemd_ready_and_pings_the_watchdog(
    tmp_path: Path, systemd_socket: tuple[socket.socket, str]
) -> None:
    sock, path = systemd_socket
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
    launcher = LauncherProcess(tmp_path / "launcher", free_port(), dict(FAST), extra_env=env)
    launcher.start()
    try:
        assert receive_until(sock, "READY") == {"READY": "1", "STATUS": "agent base running"}
        for _ in range(3):
            assert receive_until(sock, "WATCHDOG") == {"WATCHDOG": "1"}
        # the agent talked to the launcher's socket, not to systemd's
        assert str(launcher.root / "notify.sock") != path
        assert launcher.proc is not None
        launcher.proc.terminate()
        assert receive_until(sock, "STOPPING") == {"STOPPING": "1", "STATUS": "shutting down"}
    finally:
        assert launcher.stop() == 0
