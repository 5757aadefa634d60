"""Control plane replicas and agents as real processes (``edgefleet control-plane``,
``edgefleet agent``), so a test can SIGKILL one; what the test reads from the database and
from an agent's outbox file."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import sqlalchemy
import tomli_w

from agent.fleet.settings import FleetSettings
from control_plane.db.session import sync_url
from tests.agent.server import wait_until

SHARED_GROUP = "control-planes"


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    admin: httpx.Client
    log: Path


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def replica(
    name: str, state_dir: Path, db_url: str, mqtt_url: str, port: int, public_url: str
) -> Iterator[Replica]:
    """One replica: its own broker client id, the shared subscription group, and the keys and
    artifacts of ``state_dir``, which the replicas share (a volume or secret in a cluster).
    ``public_url`` is what devices fetch artifacts from: the load balancer's address."""
    exe = Path(sys.executable).parent / "edgefleet"
    env = {
        **os.environ,
        "EDGEFLEET_CP_MQTT_CLIENT_ID": f"edgefleet-{name}",
        "EDGEFLEET_CP_MQTT_SHARED_GROUP": SHARED_GROUP,
        "EDGEFLEET_CP_PUBLIC_URL": public_url,
        "EDGEFLEET_CP_ROLLOUT_TICK_S": "0.2",
        "EDGEFLEET_CP_INGEST_MAX_DELAY_S": "0.05",
        "EDGEFLEET_CP_INGEST_TELEMETRY_DELAY_S": "0.05",
        "EDGEFLEET_CP_TELEMETRY_ACK_INTERVAL_S": "0.5",
    }
    state_dir.mkdir(parents=True, exist_ok=True)
    args = [str(exe), "control-plane", "--db", db_url, "--mqtt", mqtt_url]
    args += ["--host", "127.0.0.1", "--port", str(port), "--state-dir", str(state_dir)]
    args += ["--artifact-dir", str(state_dir / "artifacts")]
    log = state_dir / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
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
            yield Replica(name, proc, url, admin, log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def agent_config(path: Path, repo: Path, fleet: FleetSettings) -> Path:
    values = fleet.model_dump(exclude_none=True)
    as_toml = {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}
    doc = {"model_repository": str(repo), "port": 0, "log_level": "INFO", "fleet": as_toml}
    path.write_text(tomli_w.dumps(doc))
    return path


def leader(db_url: str) -> str | None:
    """The holder of the lease (``<client id>:<pid>``) while it is unexpired, else None."""
    engine = sqlalchemy.create_engine(sync_url(db_url))
    try:
        with engine.connect() as conn:
            return conn.execute(
                sqlalchemy.text("SELECT holder FROM leader_leases WHERE expires_at > now()")
            ).scalar_one_or_none()
    finally:
        engine.dispose()


def stored_seqs(db_url: str) -> dict[str, list[int]]:
    """Every stored telemetry message's seq, by device, repeats included."""
    engine = sqlalchemy.create_engine(sync_url(db_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sqlalchemy.text("SELECT device_id, seq FROM device_telemetry ORDER BY seq")
            ).all()
    finally:
        engine.dispose()
    out: dict[str, list[int]] = {}
    for device_id, seq in rows:
        out.setdefault(device_id, []).append(seq)
    return out


def outbox(state_dir: Path) -> tuple[int, int | None]:
    """(last telemetry seq produced, lowest telemetry seq not yet acknowledged) of an agent,
    read from its outbox file."""
    with contextlib.closing(
        sqlite3.connect(f"file:{state_dir / 'outbox.sqlite3'}?mode=ro", uri=True)
    ) as db:
        row = db.execute("SELECT value FROM counters WHERE name = 'seq_telemetry'").fetchone()
        (held,) = db.execute("SELECT MIN(seq) FROM outbox WHERE kind = 'telemetry'").fetchone()
    return (row[0] if row else 0), held
