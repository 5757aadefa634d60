"""The control plane as a real process (``edgefleet control-plane``), so a test can SIGKILL it."""

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


@dataclass
class ControlPlaneProcess:
    proc: subprocess.Popen[bytes]
    url: str
    admin: httpx.Client
    state_dir: Path

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
    state_dir: Path, db_url: str, mqtt_url: str, port: int
) -> Iterator[ControlPlaneProcess]:
    """Start the control plane; ready when /health says the database and broker are reachable.
    The same arguments start it again on the same database, keys, port and MQTT session."""
    exe = Path(sys.executable).parent / "edgefleet"
    env = {
        **os.environ,
        "EDGEFLEET_CP_ROLLOUT_TICK_S": "0.2",
        "EDGEFLEET_CP_INGEST_MAX_DELAY_S": "0.05",
        "EDGEFLEET_CP_MQTT_CLIENT_ID": "edgefleet-cp-faults",
    }
    state_dir.mkdir(parents=True, exist_ok=True)
    args = [
        str(exe),
        "control-plane",
        "--db",
        db_url,
        "--mqtt",
        mqtt_url,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--state-dir",
        str(state_dir),
        "--artifact-dir",
        str(state_dir / "artifacts"),
    ]
    with (state_dir / "control-plane.log").open("ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _healthy(url) or proc.poll() is not None,
            timeout_s=60,
            what="the control plane process",
        )
        if proc.poll() is not None:
            raise AssertionError(
                f"control plane exited: {(state_dir / 'control-plane.log').read_text()[-3000:]}"
            )
        token = (state_dir / "admin-token").read_text().strip()
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        ) as admin:
            yield ControlPlaneProcess(proc, url, admin, state_dir)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
