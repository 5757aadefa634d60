"""Releases on trial under a real launcher process: a good one commits, the bad ones (crashing
at import, never ready, exiting in the trial window) go back to ``previous`` within the
launches allowed, with the reason in the journal and in ``edgefleet launcher status``."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.launcher.harness import LauncherProcess, build_release, cli, free_port

FAST = {
    "ready_timeout_s": "20",
    "trial_window_s": "1",
    "trial_max_launches": "3",
    "backoff_initial_s": "0.1",
    "backoff_max_s": "0.4",
    "stable_after_s": "1",
    "stop_grace_s": "10",
}


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[LauncherProcess]:
    process = LauncherProcess(tmp_path / "launcher", free_port(), dict(FAST)).start()
    yield process
    assert process.stop() == 0  # SIGTERM: the launcher stops its agent and exits 0


def install(launcher: LauncherProcess, tree: Path) -> str:
    done = cli("launcher", "install", "--root", str(launcher.root), str(tree))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_good_release_commits(launcher: LauncherProcess, tmp_path: Path) -> None:
    launcher.wait_running("base")
    out = install(launcher, build_release(tmp_path, "2.0.0", "good"))
    assert "asked the launcher" in out and "to put 2.0.0 on trial" in out
    journal = launcher.wait(lambda j: j.last_outcome is not None, "the trial's outcome")
    assert journal.last_outcome is not None
    assert (journal.last_outcome.version, journal.last_outcome.outcome) == ("2.0.0", "committed")
    journal = launcher.wait_running("2.0.0")
    assert journal.previous == "base" and journal.failed == {}
    status = cli("launcher", "status", "--root", str(launcher.root))
    assert "current:  2.0.0 (running)" in status.stdout
    assert "previous: base" in status.stdout
    assert "last:     2.0.0 committed" in status.stdout


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        (
            "crashing",
            "crashed before ready (exit 1): ImportError: no module named agent_core_v3",
        ),
        ("exits_in_window", "exited 1 during the trial window"),
    ],
)
def test_bad_release_goes_back_to_previous(
    launcher: LauncherProcess, tmp_path: Path, kind: str, reason: str
) -> None:
    launcher.wait_running("base")
    install(launcher, build_release(tmp_path, "3.0.0", kind))
    journal = launcher.wait(lambda j: j.last_outcome is not None, "the trial's outcome")
    assert journal.last_outcome is not None
    assert journal.last_outcome.outcome == "rolled_back"
    assert journal.last_outcome.reason is not None and reason in journal.last_outcome.reason
    assert reason in journal.failed["3.0.0"]
    starts = [m for m in launcher.messages("agent started") if m["version"] == "3.0.0"]
    assert len(starts) == 3  # trial_max_launches
    launcher.wait_running("base")
    status = cli("launcher", "status", "--root", str(launcher.root)).stdout
    assert f"last:     3.0.0 rolled_back: {reason}" in status


def test_never_ready_release_goes_back(tmp_path: Path) -> None:
    settings = {**FAST, "ready_timeout_s": "3", "trial_max_launches": "2"}
    launcher = LauncherProcess(tmp_path / "launcher", free_port(), settings).start()
    try:
        launcher.wait_running("base")
        install(launcher, build_release(tmp_path, "4.0.0", "never_ready"))
        launcher.wait(lambda j: j.trial is not None and j.phase == "trial", "the trial")
        # another process of the same user says READY=1 on the launcher's socket: not counted
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stranger:
            stranger.sendto(b"READY=1", str(launcher.root / "notify.sock"))
        journal = launcher.wait(lambda j: j.last_outcome is not None, "the trial's outcome")
        assert journal.last_outcome is not None
        assert journal.last_outcome.outcome == "rolled_back"
        assert journal.last_outcome.reason == "not ready within 3 s"
        launcher.wait_running("base")
        ignored = launcher.messages("notify message not from the agent ignored")
        assert [m["pid"] for m in ignored] == [os.getpid()]
    finally:
        assert launcher.stop() == 0


def test_failed_release_is_retried_only_when_asked(
    launcher: LauncherProcess, tmp_path: Path
) -> None:
    from agent.launcher.journal import PendingRelease, save_pending

    launcher.wait_running("base")
    install(launcher, build_release(tmp_path, "3.0.0", "crashing"))
    first = launcher.wait(lambda j: "3.0.0" in j.failed, "the rollback")
    # asked again without the operator's retry (a retained desired state, say): refused
    save_pending(launcher.root, PendingRelease(version="3.0.0"))
    cli("launcher", "retry", "--root", str(launcher.root), "no-such-version")
    assert first.launcher_pid is not None
    import os
    import signal

    os.kill(first.launcher_pid, signal.SIGHUP)
    refused = launcher.wait(
        lambda j: j.last_outcome is not None and j.last_outcome.reason.startswith("not retried"),
        "the refusal",
    )
    assert refused.current == "base" and refused.trial is None
    starts = [m for m in launcher.messages("agent started") if m["version"] == "3.0.0"]
    assert len(starts) == 3
    # the operator asks: it goes on trial again (and fails again)
    done = cli("launcher", "retry", "--root", str(launcher.root), "3.0.0")
    assert done.returncode == 0, done.stderr
    launcher.wait(
        lambda j: j.last_outcome is not None and j.last_outcome.at > refused.last_outcome.at,
        "the retried trial's outcome",
    )
    starts = [m for m in launcher.messages("agent started") if m["version"] == "3.0.0"]
    assert len(starts) == 6
    launcher.wait_running("base")


def test_release_whose_watchdog_pings_stop_goes_back(tmp_path: Path) -> None:
    # the real agent pings every half of WATCHDOG_USEC (agent/systemd.py); a hung one does not
    settings = {**FAST, "child_watchdog_s": "1", "trial_window_s": "5", "trial_max_launches": "1"}
    launcher = LauncherProcess(tmp_path / "launcher", free_port(), settings).start()
    try:
        launcher.wait_running("base")
        install(launcher, build_release(tmp_path, "5.0.0", "silent_after_ready"))
        journal = launcher.wait(lambda j: j.last_outcome is not None, "the trial's outcome")
        assert journal.last_outcome is not None
        assert journal.last_outcome.outcome == "rolled_back"
        assert journal.last_outcome.reason == "watchdog pings stopped for 1 s"
        launcher.wait_running("base")
    finally:
        assert launcher.stop() == 0
