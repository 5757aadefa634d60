"""docs/quickstart-fleet.md stays true: its ```sh blocks, run verbatim in one bash session from an
empty directory, reach a rollout committed on two agents.

The page chooses its ports through ``EF_*`` variables with defaults; the test sets free ones, and
changes nothing else. Every process the page starts is in the session's process group, which
the test ends whatever happened (the page's own last block stops them first).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mqtt_broker import free_port

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "quickstart-fleet.md"
BLOCK = re.compile(r"^```(sh|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)
TIMEOUT_S = 240
ROLLOUT_JSON = ".quickstart-rollout.json"


def page_blocks() -> list[str]:
    """The page's commands, block by block: ```sh as is, ```console the lines after ``$ ``."""
    blocks = []
    for kind, body in BLOCK.findall(PAGE.read_text()):
        if kind == "console":
            body = "".join(line[2:] + "\n" for line in body.splitlines() if line.startswith("$ "))
        blocks.append(body)
    return blocks


@pytest.fixture
def workdir() -> Iterator[Path]:
    # NOTE: not tmp_path: pytest's temporary directories are mode 0700, and a Mosquitto started
    # by root reads its files as the mosquitto user, which must reach them (the page says so)
    path = Path(tempfile.mkdtemp(prefix="edgefleet-quickstart-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_")}
    path = [str(Path(sys.executable).parent), env.get("PATH", "")]
    path += [d for d in ("/usr/sbin", "/sbin") if d not in env.get("PATH", "").split(":")]
    env["PATH"] = ":".join(path)
    ports = ("EF_MQTT_PORT", "EF_CP_MQTT_PORT", "EF_API_PORT", "EF_EDGE1_PORT", "EF_EDGE2_PORT")
    for name in ports:
        env[name] = str(free_port())
    return env


def _logs(workdir: Path) -> str:
    parts = []
    for log in sorted(workdir.rglob("*.log")):
        parts.append(f"--- {log.relative_to(workdir)}\n{log.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)


def test_the_page_has_commands_and_ends_by_stopping_what_it_started() -> None:
    blocks = page_blocks()
    assert len(blocks) >= 6
    assert "kill $(jobs -p)" in blocks[-1]
    assert any("edgefleet fleet init" in b for b in blocks)


@pytest.mark.slow
def test_the_quickstart_reaches_a_rollout_committed_on_two_agents(workdir: Path) -> None:
    *steps, stop = page_blocks()
    # read between the page's last step and its stop, while everything still runs
    capture = f"edgefleet rollouts status 1 --json > {ROLLOUT_JSON}\n"
    script = "set -e\n" + "\n".join([*steps, capture, stop])
    output = workdir / ".quickstart-output"
    with output.open("wb") as out:
        env = _environment()
        shell = subprocess.Popen(
            ["bash", "-c", script],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the page's background jobs too
        )
        try:
            rc = shell.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            _end_group(shell.pid)
    shown = output.read_text(errors="replace")[-4000:]
    assert rc == 0, f"exit {rc}\n{shown}\n{_logs(workdir)}"
    _dashboard_read_telemetry_and_nothing_was_taken_over(workdir, output.read_text(), env)
    rollout = json.loads((workdir / ROLLOUT_JSON).read_text())
    devices = {d["device_id"]: d["state"] for d in rollout["devices"]}
    assert rollout["state"] == "succeeded", f"{rollout}\n{_logs(workdir)}"
    assert devices == {"edge-1": "committed", "edge-2": "committed"}
    # both agents answered the page's last requests with version 2
    statuses = [json.loads(line) for line in shown.splitlines() if '"model_version_status"' in line]
    assert len(statuses) == 2, shown
    for status in statuses:
        versions = {v["version"]: v["state"] for v in status["model_version_status"]}
        assert versions.get("2") == "AVAILABLE", status


def _dashboard_read_telemetry_and_nothing_was_taken_over(
    workdir: Path, printed: str, env: dict[str, str]
) -> None:
    """The page's dashboard line is the one ``fleet init`` printed; it read two devices'
    telemetry; neither the broker nor the control plane logged a session taken over."""
    line = next(b for b in page_blocks() if "mosquitto_sub" in b).strip().removesuffix(" -C 2")
    assert line.replace("$EF_MQTT_PORT", env["EF_MQTT_PORT"]) in printed
    telemetry = [
        x for x in printed.splitlines() if re.match(r"edgefleet/devices/[^/]+/telemetry ", x)
    ]
    assert len(telemetry) == 2, printed[-4000:]
    assert "already connected" not in (workdir / "broker.log").read_text()
    assert "session taken over" not in (workdir / "control-plane.log").read_text()


def _end_group(pgid: int) -> None:
    """SIGTERM to every process of the session, then SIGKILL to what is left after 20 s."""
    for sig, grace_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        if _group_gone(pgid, grace_s):
            return


def _group_gone(pgid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
