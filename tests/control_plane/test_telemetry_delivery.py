"""Every telemetry sequence number reaches the control plane's store exactly once, across
brokers that lose their state: three agents report every 0.2 s while the broker is SIGKILLed
and restarted without its persistence three times (a broker so restarted has acknowledged
messages it then delivers to no one). The agents keep each message until the control plane
acknowledges it.

Real Mosquitto, real control plane (SQLite and PostgreSQL), three real agents."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from agent.fleet.settings import FleetSettings
from control_plane.db.session import sync_url
from tests.access.metrics import counts
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.control_plane.conftest import ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.control_plane.test_broker_reset import _lose_broker_state
from tests.mqtt_broker import Mosquitto, free_port

pytestmark = pytest.mark.slow

DEVICES = ("dev-1", "dev-2", "dev-3")
REJECTED = "edgefleet_messages_rejected_total"


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
    out: dict[str, list[int]] = {d: [] for d in DEVICES}
    for device_id, seq in rows:
        out[device_id].append(seq)
    return out


def stored_more(db_url: str, more: int, devices: tuple[str, ...] = DEVICES) -> None:
    """Wait until each of ``devices`` has ``more`` telemetry messages stored than now."""
    start = stored_seqs(db_url)
    wait_until(
        lambda: all(
            len(now[d]) >= len(start[d]) + more for now in [stored_seqs(db_url)] for d in devices
        ),
        what=f"{more} more telemetry messages from each of {devices}",
    )


def refused_acks(cp: RunningControlPlane) -> float:
    return counts(cp.admin.get("/metrics").text, REJECTED)[("acks", "refused_by_broker")]


def outbox_of(state_dir: Path) -> tuple[int, int, int]:
    """(last telemetry seq, telemetry rows still held, telemetry dropped) of an agent's outbox,
    read from its file."""
    uri = f"file:{state_dir / 'outbox.sqlite3'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        counters = dict(db.execute("SELECT name, value FROM counters").fetchall())
        (held,) = db.execute("SELECT COUNT(*) FROM outbox WHERE kind = 'telemetry'").fetchone()
    return counters.get("seq_telemetry", 0), held, counters.get("dropped_telemetry", 0)


def test_every_seq_is_stored_once_across_brokers_that_lose_their_state(
    start_control_plane: ControlPlaneFactory,
    broker: Mosquitto,
    db_url: str,
    example_repo: Path,
    tmp_path: Path,
) -> None:
    @contextmanager
    def agents(cp: RunningControlPlane, **fleet: Any) -> Iterator[list[RunningAgent]]:
        with ExitStack() as stack:
            running = []
            for device_id in DEVICES:
                repo = tmp_path / f"repo-{device_id}"
                if not repo.exists():
                    copy_models(example_repo, repo, "mlp")
                settings = FleetSettings(
                    mqtt_url=broker.url,
                    device_id=device_id,
                    state_dir=tmp_path / f"state-{device_id}",
                    trust_root_file=cp.trust_root_file,
                    reconnect_min_s=0.05,
                    reconnect_max_s=0.5,
                    telemetry_resend_s=2.0,
                    **fleet,
                )
                running.append(stack.enter_context(serve(repo, fleet=settings)))
            yield running

    with start_control_plane(telemetry_ack_interval_s=0.3) as cp:
        with agents(cp, telemetry_interval_s=0.2):
            wait_until(
                lambda: all(len(s) >= 3 for s in stored_seqs(db_url).values()),
                what="telemetry from every agent",
            )
            for _ in range(3):
                stored_more(db_url, 5)  # the agents report through this broker, then it dies
                _lose_broker_state(broker)
            stored_more(db_url, 5)
        # The agents again, with no new telemetry: what was never acknowledged goes again.
        with agents(cp, telemetry_interval_s=3600):
            wait_until(
                lambda: all(outbox_of(tmp_path / f"state-{d}")[1] == 0 for d in DEVICES),
                timeout_s=60,
                what="every agent's telemetry acknowledged",
            )
        stored = stored_seqs(db_url)
    for device_id in DEVICES:
        last, held, dropped = outbox_of(tmp_path / f"state-{device_id}")
        assert last >= 20 and held == 0 and dropped == 0, (device_id, last, held, dropped)
        assert stored[device_id] == list(range(1, last + 1)), device_id


def test_a_broker_that_refuses_acknowledgements_costs_no_session(
    db_url: str, example_repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fleet upgraded without regenerating its broker ACL: the broker refuses the control
    plane's acknowledgements (PUBACK 0x87). They are dropped and counted, the session stays,
    and telemetry is stored as before; the agents, never acknowledged, keep every message
    (the broker's PUBACK frees none) and say once that nothing is acknowledged."""
    caplog.set_level(logging.WARNING, logger="edgefleet.agent.fleet")
    acl = tmp_path / "acl"
    acl.write_text(
        "".join(
            f"topic readwrite edgefleet/devices/+/{leaf}\n"
            for leaf in ("status", "telemetry", "events", "desired", "commands")
        )
        + "topic readwrite edgefleet/fleet/trust\n"
    )
    broker = Mosquitto(tmp_path / "broker", extra_config=f"allow_anonymous true\nacl_file {acl}\n")
    broker.start()
    try:
        with control_plane(
            tmp_path / "cp-state", db_url, broker.url, free_port(), telemetry_ack_interval_s=0.2
        ) as cp:
            repo = copy_models(example_repo, tmp_path / "repo", "mlp")
            settings = FleetSettings(
                mqtt_url=broker.url,
                device_id="dev-1",
                state_dir=tmp_path / "state",
                trust_root_file=cp.trust_root_file,
                telemetry_interval_s=0.2,
                telemetry_resend_s=0.2,
            )
            with serve(repo, fleet=settings):
                wait_until(lambda: len(stored_seqs(db_url)["dev-1"]) >= 3, what="telemetry")
                wait_until(
                    lambda: 'topic="acks"' in cp.admin.get("/metrics").text,
                    what="an acknowledgement refused and counted",
                )
                log = broker.workdir / "mosquitto.log"
                connects = log.read_text().count("New client connected")
                refused = refused_acks(cp)
                wait_until(lambda: refused_acks(cp) >= refused + 10, what="ten more refusals")
                stored_more(db_url, 5, ("dev-1",))  # stored meanwhile, on the same session
                assert log.read_text().count("New client connected") == connects  # no reconnect
                assert cp.services.bus.connected.is_set()
                assert cp.admin.get("/health").status_code == 200
                wait_until(
                    lambda: any(
                        "acknowledges no telemetry" in r.getMessage() for r in caplog.records
                    ),
                    what="the agent to say it is never acknowledged",
                )
            last, held, dropped = outbox_of(tmp_path / "state")
            assert held == last and dropped == 0 and last >= 10  # every message kept
    finally:
        broker.stop()
