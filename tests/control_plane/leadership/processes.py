"""Control plane replicas and agents as real processes (``edgefleet control-plane``,
``edgefleet agent``), so a test can SIGKILL one; what the test reads from the database and
from an agent's outbox file."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy
import tomli_w

from agent.fleet.settings import FleetSettings
from control_plane.db.session import sync_url
from tests.agent.server import wait_until
from tests.control_plane.process import ControlPlaneProcess, control_plane_process

SHARED_GROUP = "control-planes"


Replica = ControlPlaneProcess


@contextmanager
def replica(
    name: str,
    state_dir: Path,
    db_url: str,
    mqtt_url: str,
    port: int,
    public_url: str,
    env: dict[str, str] | None = None,
) -> Iterator[Replica]:
    """One replica: its own broker client id, the shared subscription group, and the keys and
    artifacts of ``state_dir``, which the replicas share (a volume or secret in a cluster).
    ``public_url`` is what devices fetch artifacts from: the load balancer's address. ``env``:
    more settings (``EDGEFLEET_CP_*``), such as the broker login."""
    settings = {
        "EDGEFLEET_CP_MQTT_CLIENT_ID": f"edgefleet-{name}",
        "EDGEFLEET_CP_MQTT_SHARED_GROUP": SHARED_GROUP,
        "EDGEFLEET_CP_PUBLIC_URL": public_url,
        "EDGEFLEET_CP_INGEST_TELEMETRY_DELAY_S": "0.05",
        "EDGEFLEET_CP_TELEMETRY_ACK_INTERVAL_S": "0.5",
        **(env or {}),
    }
    with control_plane_process(name, state_dir, db_url, mqtt_url, port, settings) as running:
        yield running


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


def every_seq_stored_once(db_url: str, state_dirs: dict[str, Path]) -> dict[str, int]:
    """Each device's telemetry 1..N, N what its outbox had produced when called, acknowledged
    to the device end to end and stored exactly once; returns each device's N."""
    marks = {device_id: outbox(state)[0] for device_id, state in state_dirs.items()}

    def acknowledged() -> bool:  # nothing up to N still held for want of its ack
        for device_id, mark in marks.items():
            lowest_held = outbox(state_dirs[device_id])[1]
            if lowest_held is not None and lowest_held <= mark:
                return False
        return True

    wait_until(acknowledged, timeout_s=30, what="acknowledgements of every seq up to N")
    seqs = stored_seqs(db_url)
    for device_id, mark in marks.items():
        upto = [s for s in seqs.get(device_id, []) if s <= mark]
        assert upto == list(range(1, mark + 1)), (
            f"{device_id}: missing {sorted(set(range(1, mark + 1)) - set(upto))[:20]}, "
            f"{len(upto) - len(set(upto))} stored twice"
        )
    return marks
