"""PostgreSQL restarted (fast and immediate shutdown) under a running control plane, while a
device sends telemetry and clients call the API: the control plane reconnects, calls made
during the outage get 503 with a clear message (never 500), and no telemetry is lost.

The server is a private PostgreSQL 15 on a free port (tests/faults/postgres.py), never the
shared one."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.fleet.settings import FleetSettings
from tests.agent.server import copy_models, serve, wait_until
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.faults.conftest import missing_telemetry, oldest_held, stored_seqs
from tests.faults.postgres import PostgresServer, ShutdownMode, available
from tests.mqtt_broker import Mosquitto, free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    why = available()
    if why is not None:
        pytest.skip(why)
    server = PostgresServer().init()
    try:
        server.start()
        yield server
    finally:
        server.destroy()


class ApiProbe:
    """A client calling the API back to back (a read and a write) and keeping every answer."""

    def __init__(self, cp: RunningControlPlane) -> None:
        self.cp = cp
        self.answers: list[tuple[int, str]] = []
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.cp.url, headers=self.cp.admin.headers, timeout=30) as c:
            while not self.stop.is_set():
                for method, path, body in (
                    ("GET", "/api/v1/devices", None),
                    ("PATCH", "/api/v1/devices/dev-pg/labels", {"labels": {"probe": "1"}}),
                ):
                    try:
                        resp = c.request(method, path, json=body)
                    except httpx.HTTPError as exc:  # a dropped connection: what a 500 does
                        self.answers.append((0, repr(exc)))
                        continue
                    self.answers.append((resp.status_code, resp.text))

    def since(self, mark: int) -> list[tuple[int, str]]:
        return self.answers[mark:]

    def __enter__(self) -> ApiProbe:
        self._thread.start()
        wait_until(lambda: len(self.answers) > 5, what="the API probe")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(timeout=60)


def _outage(
    postgres: PostgresServer, probe: ApiProbe, cp: RunningControlPlane, mode: ShutdownMode
) -> list[tuple[int, str]]:
    """Stop PostgreSQL, wait until the API has answered during the outage, start it again,
    wait until the API answers 200 again; return what the API said meanwhile."""
    mark = len(probe.answers)
    postgres.stop(mode)
    wait_until(
        lambda: any(code != 200 for code, _ in probe.since(mark)), what="answers during the outage"
    )
    health = httpx.get(f"{cp.url}/health", timeout=30)
    assert health.status_code == 503 and health.json()["database"] is False
    # device messages that cannot be stored do not make their devices silent
    wait_until(lambda: cp.services.metrics.hearing_since is None, what="silence not counted")
    down = len(probe.answers)
    postgres.start()
    try:
        wait_until(
            lambda: probe.since(down)[-4:] and all(c == 200 for c, _ in probe.since(down)[-4:]),
            timeout_s=60,
        )
    except TimeoutError:
        raise AssertionError(f"the API did not recover: {probe.since(down)[-4:]}") from None
    assert httpx.get(f"{cp.url}/health", timeout=30).status_code == 200
    wait_until(lambda: cp.services.metrics.hearing_since is not None, what="silence counted")
    return probe.since(mark)


def test_postgres_restarts_fast_and_immediate_cost_503s_and_no_telemetry(
    postgres: PostgresServer,
    broker: Mosquitto,
    example_repo: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db_url = postgres.create_database(f"edgefleet_{uuid.uuid4().hex[:8]}")
    with control_plane(tmp_path / "cp", db_url, broker.url, free_port()) as cp:
        fleet = FleetSettings(
            mqtt_url=broker.url,
            device_id="dev-pg",
            state_dir=tmp_path / "state",
            trust_root_file=cp.trust_root_file,
            telemetry_interval_s=0.05,
            reconnect_min_s=0.05,
            reconnect_max_s=0.5,
        )
        repo = copy_models(example_repo, tmp_path / "repo", "mlp")
        with serve(repo, fleet=fleet) as agent, ApiProbe(cp) as probe:
            client = agent.state.fleet
            assert client is not None
            wait_until(lambda: len(stored_seqs(db_url, "dev-pg")) >= 5, what="telemetry stored")
            during = _outage(postgres, probe, cp, "fast") + _outage(
                postgres, probe, cp, "immediate"
            )
            # telemetry produced while the database was away and after it came back
            mark = client.outbox_seq()
            wait_until(lambda: client.outbox_seq() >= mark + 5, what="more telemetry")
            produced = client.outbox_seq()
            # drained in order: once empty, every message up to here was acknowledged
            # every message up to here acknowledged (telemetry keeps coming, each held until the
            # control plane's next acknowledgement, so the outbox itself is never empty for long)
            wait_until(
                lambda: oldest_held(tmp_path / "state") > produced,
                timeout_s=90,
                what="the outbox to drain",
            )
        missing = missing_telemetry(db_url, "dev-pg", produced)
    codes = Counter(code for code, _ in during)
    assert codes[503] > 0 and set(codes) <= {200, 503}, (
        codes,
        [b for c, b in during if c not in (200, 503)][:3],
    )
    unavailable = [body for code, body in during if code == 503]
    assert all("database" in body and "unavailable" in body for body in unavailable), unavailable[
        :3
    ]
    held = [
        r
        for r in caplog.records
        if r.getMessage() == "database unavailable, holding device messages"
    ]
    assert held, "no device message arrived during an outage: the test proved nothing"
    assert not missing, f"telemetry lost: {sorted(missing)[:20]}"
