"""The control plane as a real process (``edgefleet control-plane``), so a test can SIGKILL it
and start it again: alone (tests/faults) or as one of several replicas (tests/control_plane/
leadership). Ready when ``/health`` says its database and broker are reachable."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.agent.server import wait_until

FAST_TICKS = {
    "EDGEFLEET_CP_ROLLOUT_TICK_S": "0.2",
    "EDGEFLEET_CP_INGEST_MAX_DELAY_S": "0.05",
}
"""What a test does not want to wait for: the rollout engine's tick, the ingest's batching."""


@dataclass
class ControlPlaneProcess:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    admin: httpx.Client
    state_dir: Path
    log: Path

    @property
    def trust_root_file(self) -> Path:
        return self.state_dir / "trust-root.json"


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def control_plane_process(
    name: str,
    state_dir: Path,
    db_url: str,
    mqtt_url: str,
    port: int,
    env: dict[str, str] | None = None,
) -> Iterator[ControlPlaneProcess]:
    """Start ``edgefleet control-plane`` on ``state_dir`` (its keys, artifacts and admin
    token) with ``env``'s settings over :data:`FAST_TICKS`; its output goes to
    ``state_dir/<name>.log``. The same arguments start it again on the same database, keys,
    port and MQTT session. Stopped (terminated, killed past 30 s) on exit."""
    exe = Path(sys.executable).parent / "edgefleet"
    environment = {**os.environ, **FAST_TICKS, **(env or {})}
    state_dir.mkdir(parents=True, exist_ok=True)
    args = [str(exe), "control-plane", "--db", db_url, "--mqtt", mqtt_url]
    args += ["--host", "127.0.0.1", "--port", str(port), "--state-dir", str(state_dir)]
    args += ["--artifact-dir", str(state_dir / "artifacts")]
    log = state_dir / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=environment)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _healthy(url) or proc.poll() is not None, timeout_s=60, what=f"{name} to start"
        )
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited: {log.read_text()[-3000:]}")
        token = (state_dir / "admin-token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as admin:
            yield ControlPlaneProcess(name, proc, url, admin, state_dir, log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
