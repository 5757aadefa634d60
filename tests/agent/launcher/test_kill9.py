"""kill -9 of the launcher at each step of an update, then the launcher started again: each
time it finishes or undoes the step and a runnable agent serves.

The steps in between which the launcher is killed are its journal writes (agent/launcher/
requests.py draws them). "During the trial" and "after the commit" kill the real process
while its agent runs; "after the unpack" kills it before it heard of the release; "after the
flip" starts the launcher on the journal the flip writes (the kill cannot be aimed between two
lines of the launcher from outside, so the test writes that file with the launcher's own type).
"""

from __future__ import annotations

from pathlib import Path

from agent.launcher.journal import Journal, Trial, save_journal
from agent.launcher.releases import Releases
from tests.agent.launcher.harness import (
    LauncherProcess,
    build_release,
    cli,
    free_port,
    port_free,
)
from tests.agent.launcher.test_trial import FAST
from tests.agent.server import wait_until


def restart(old: LauncherProcess, **settings: str) -> LauncherProcess:
    return LauncherProcess(old.root, old.port, {**FAST, **settings}).start()


def killed(launcher: LauncherProcess) -> None:
    launcher.kill9()
    # the agent dies with its launcher (PR_SET_PDEATHSIG): no orphan holds the port
    wait_until(lambda: port_free(launcher.port), what="the orphaned agent to die")


def test_kill_after_unpack(tmp_path: Path) -> None:
    launcher = LauncherProcess(tmp_path / "launcher", free_port(), dict(FAST)).start()
    launcher.wait_running("base")
    killed(launcher)
    # an install cut short leaves a staging folder; a whole one leaves the release and
    # pending.json, with nobody to wake
    half = launcher.root / "releases" / ".staging-interrupted"
    (half / "tree" / "lib").mkdir(parents=True)
    done = cli(
        "launcher",
        "install",
        "--root",
        str(launcher.root),
        str(build_release(tmp_path, "2.0.0", "good")),
    )
    assert done.returncode == 0, done.stderr
    assert "2.0.0 goes on trial when the launcher starts" in done.stdout
    again = restart(launcher)
    try:
        journal = again.wait_running("2.0.0")
        assert journal.last_outcome is not None and journal.last_outcome.outcome == "committed"
        assert not half.exists()
        assert again.messages("removed an interrupted install")[0]["folder"] == half.name
    finally:
        assert again.stop() == 0


def test_kill_after_flip(tmp_path: Path) -> None:
    root = tmp_path / "launcher"
    Releases(root / "releases").install(build_release(tmp_path, "2.0.0", "good"))
    flipped = Journal(current="2.0.0", trial=Trial(version="2.0.0", previous="base"))
    save_journal(root / "launcher.json", flipped)
    launcher = LauncherProcess(root, free_port(), dict(FAST)).start()
    try:
        journal = launcher.wait_running("2.0.0")
        assert journal.previous == "base"
        assert launcher.messages("resuming a trial")[0]["version"] == "2.0.0"
    finally:
        assert launcher.stop() == 0


def test_kill_during_trial(tmp_path: Path) -> None:
    # a long trial window, so that the kill lands inside it
    launcher = LauncherProcess(
        tmp_path / "launcher", free_port(), {**FAST, "trial_window_s": "600"}
    ).start()
    launcher.wait_running("base")
    cli(
        "launcher",
        "install",
        "--root",
        str(launcher.root),
        str(build_release(tmp_path, "2.0.0", "good")),
    )
    launcher.wait(
        lambda j: (
            j.trial is not None and j.phase == "trial" and launcher.messages("agent ready")[1:]
        ),
        "2.0.0 ready on trial",
    )
    killed(launcher)
    assert launcher.journal().trial == Trial(version="2.0.0", previous="base", launches=1)
    again = restart(launcher)
    try:
        journal = again.wait_running("2.0.0")  # the second launch of the trial commits
        assert journal.last_outcome is not None and journal.last_outcome.outcome == "committed"
        assert [m["trial"] for m in again.messages("agent started")] == [True]
    finally:
        assert again.stop() == 0


def test_kill_loop_during_a_bad_trial_still_goes_back(tmp_path: Path) -> None:
    # a release that never gets ready, and a launcher killed during each of its launches:
    # launches are counted before they start, so the kills count as failures
    settings = {**FAST, "ready_timeout_s": "600", "trial_max_launches": "2"}
    launcher = LauncherProcess(tmp_path / "launcher", free_port(), settings).start()
    launcher.wait_running("base")
    cli(
        "launcher",
        "install",
        "--root",
        str(launcher.root),
        str(build_release(tmp_path, "4.0.0", "never_ready")),
    )
    for launch in (1, 2):
        launcher.wait(
            lambda j, n=launch: j.trial is not None and j.trial.launches == n, f"launch {launch}"
        )
        killed(launcher)
        launcher = restart(launcher, ready_timeout_s="600", trial_max_launches="2")
    try:
        journal = launcher.wait_running("base")
        assert journal.last_outcome is not None
        assert journal.last_outcome.outcome == "rolled_back"
        assert "4.0.0" in journal.failed
    finally:
        assert launcher.stop() == 0


def test_kill_after_commit(tmp_path: Path) -> None:
    launcher = LauncherProcess(tmp_path / "launcher", free_port(), dict(FAST)).start()
    launcher.wait_running("base")
    cli(
        "launcher",
        "install",
        "--root",
        str(launcher.root),
        str(build_release(tmp_path, "2.0.0", "good")),
    )
    launcher.wait_running("2.0.0")
    killed(launcher)
    again = restart(launcher)
    try:
        journal = again.wait_running("2.0.0")
        assert journal.previous == "base" and journal.trial is None
        assert [m["trial"] for m in again.messages("agent started")] == [False]
    finally:
        assert again.stop() == 0
