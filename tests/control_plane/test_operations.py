"""Operating the control plane: the CLI against a real server, key rotation reaching real agents,
labels, telemetry retention, fleet metrics, and migrations that match the models."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, func, select

from control_plane.api.fleet import windows
from control_plane.db.bulk import insert_ignore
from control_plane.db.models import Base, TelemetryRollup, TelemetrySample
from control_plane.db.session import (
    alembic_config,
    make_engine,
    migrate,
    session_factory,
    sync_url,
)
from control_plane.ingest.ingestor import Ingestor
from control_plane.ingest.retention import compact, expired
from control_plane.metrics import FleetMetrics
from control_plane.settings import ControlPlaneSettings
from runtimes.examples.variants import mlp_version
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_rollouts import served, wait_devices, wait_rollout


def edgefleet(cp: RunningControlPlane, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "edgefleet"
    env = {**os.environ, "EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": token}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_cli_push_validate_label_roll_out_and_rotate_keys(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    v2, v3 = mlp_version(tmp_path / "v2", seed=2), mlp_version(tmp_path / "v3", seed=3)
    config = tmp_path / "serving.toml"
    config.write_text(
        "[batching]\nmax_batch_size = 16\n[health]\nwindow_s = 0.2\nmin_requests = 100000\n"
    )
    with start_control_plane() as cp, start_agent("dev-a", cp) as a, start_agent("dev-b", cp) as b:
        wait_devices(cp, "dev-a", "dev-b")
        op = cp.token("operator", "ops")
        pushed = edgefleet(cp, op, "models", "push", "mlp", "2", str(v2), "--config", str(config))
        assert pushed.returncode == 0, pushed.stderr
        assert "uploaded" in pushed.stdout and "golden.npz" in pushed.stdout
        checked = edgefleet(cp, op, "models", "validate", "mlp", "2")
        assert checked.returncode == 0 and checked.stdout.strip().endswith("passed"), checked.stdout
        assert "mlp: v2 candidate (valid)" in edgefleet(cp, op, "models", "list").stdout
        # operator labels decide who is targeted: only dev-b joins the canary group
        assert edgefleet(cp, op, "devices", "label", "dev-b", "ring=canary").returncode == 0
        listed = edgefleet(cp, op, "devices", "list", "--label", "ring=canary")
        assert "dev-b" in listed.stdout and "dev-a" not in listed.stdout
        create = ["rollouts", "create", "--model", "mlp"]
        one_wave = ["--waves", "100%", "--bake-time", "0.5", "--allow-unjudged"]  # no traffic
        canary = ["--selector", "ring=canary"]
        created = edgefleet(cp, op, *create, "--version", "2", *canary, *one_wave)
        assert created.returncode == 0, created.stderr
        assert created.stdout.startswith("rollout 1: running, 1 devices in 1 waves")
        watched = edgefleet(cp, op, "rollouts", "status", "1", "--watch")
        assert "rollout 1: succeeded" in watched.stdout, watched.stdout
        assert served(b) == "2" and served(a) == "1"
        assert (
            b.client.get("/v2/models/mlp/config").json()["edgefleet"]["batching"]["max_batch_size"]
            == 16
        )
        # rotate the manifest key: devices get trust root 2 and accept what the new key signs
        viewer = cp.token("viewer")
        assert edgefleet(cp, viewer, "keys", "rotate").returncode != 0  # an admin action
        admin = (cp.state_dir / "admin-token").read_text().strip()
        rotated = edgefleet(cp, admin, "keys", "rotate")
        assert rotated.returncode == 0 and "signing with" in rotated.stdout

        def both_on_trust_root_2() -> bool:
            return b.state.fleet.trust.version == 2 and a.state.fleet.trust.version == 2  # type: ignore[union-attr]

        wait_until(both_on_trust_root_2, what="trust root 2 on both devices")
        assert (
            edgefleet(
                cp, op, "models", "push", "mlp", "3", str(v3), "--config", str(config)
            ).returncode
            == 0
        )
        assert edgefleet(cp, op, "models", "validate", "mlp", "3").returncode == 0
        edgefleet(cp, op, *create, "--version", "3", *one_wave)
        doc = wait_rollout(cp, 2, "succeeded")
        assert doc["state"] == "succeeded" and served(a) == "3" and served(b) == "3"
        keys = cp.admin.get("/api/v1/keys").json()["trust_root"]["manifest_keys"]
        new_key = rotated.stdout.split()[2].rstrip(";")
        old_key = next(k["key_id"] for k in keys if k["key_id"] != new_key)
        revoked = edgefleet(cp, admin, "keys", "revoke", old_key)
        assert revoked.returncode == 0 and old_key in revoked.stdout
        wait_until(lambda: old_key in a.state.fleet.trust.revoked, what="the revocation")  # type: ignore[union-attr]
        audit = {e["action"] for e in cp.admin.get("/api/v1/audit").json()}
        assert {"device.labels", "keys.rotate", "keys.revoke", "rollout.create"} <= audit


def test_telemetry_is_downsampled_and_expires(db_url: str, tmp_path: Path) -> None:
    migrate(db_url)
    settings = ControlPlaneSettings(
        db_url=db_url,
        telemetry_raw_retention_s=3600,
        telemetry_rollup_s=60,
        telemetry_rollup_retention_s=86400,
    )
    now = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)

    async def scenario() -> tuple[int, list[tuple[int, int, float | None]], int]:
        engine = make_engine(db_url)
        sessions = session_factory(engine)
        rows = []
        for i, age in enumerate(
            (7200, 7190, 7180, 10, 200000)
        ):  # three old, one fresh, one ancient
            at = now - timedelta(seconds=age)
            row = {
                "device_id": "d",
                "seq": i + 1,
                "time": at,
                "received_at": at,
                "window_s": 10,
                "model": "m",
                "version": 1,
                "requests": 10,
                "errors": i,
                "rows": 10,
                "batches": 1,
                "p50_ms": 1.0,
                "p95_ms": 2.0,
                "p99_ms": 3.0 + i,
                "queue_depth": 0,
            }
            rows.append(row)
        async with sessions.begin() as s:
            await insert_ignore(s, TelemetrySample.__table__, rows)
        folded = await compact(sessions, settings, now=now)
        async with sessions() as s:
            query = select(
                TelemetryRollup.requests, TelemetryRollup.errors, TelemetryRollup.p99_ms_max
            )
            rollups = (await s.execute(query)).all()
            raw = (await s.execute(select(func.count()).select_from(TelemetrySample))).scalar_one()
        await engine.dispose()
        return folded, [tuple(r) for r in rollups], raw

    folded, rollups, raw = asyncio.run(scenario())
    assert folded == 4 and raw == 1  # the fresh window stays raw
    # the three old windows share one minute; the ancient one's rollup is past retention
    assert rollups == [(30, 3, 5.0)]


@pytest.mark.slow
def test_fleet_metrics(start_control_plane: ControlPlaneFactory, start_agent: AgentFactory) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp) as a:
        wait_devices(cp, "dev-a")
        for _ in range(5):
            served(a)
        text = ""

        def counted() -> bool:
            nonlocal text
            text = cp.admin.get("/metrics").text
            return 'edgefleet_fleet_requests_total{model="mlp",version="1"} 5.0' in text

        wait_until(counted, what="the requests in the fleet metrics")
        assert (
            "edgefleet_devices_online 1.0" in text and "edgefleet_telemetry_messages_total" in text
        )
        health = cp.admin.get("/health").json()
        leader = health.pop("leader")  # the one replica: epoch 0 on SQLite, a lease's on PG
        assert health == {"status": "ok", "database": True, "mqtt": True}
        assert leader["this_replica"] is True and leader["id"] and leader["epoch"] >= 0
        text = cp.admin.get("/metrics").text
        epoch = f'edgefleet_leader_epoch{{leader="{leader["id"]}"}} {float(leader["epoch"])}'
        assert epoch in text and "edgefleet_leading 1.0" in text


def test_retention_reads_what_expired_through_the_time_index(tmp_path: Path) -> None:
    """Not the whole telemetry table on every maintenance pass (SQLite's query plan)."""
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    migrate(url)
    engine = create_engine(url)
    query = expired(datetime(2026, 12, 1, tzinfo=UTC))
    sql = str(query.compile(engine, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        plan = " | ".join(row[-1] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
    engine.dispose()
    # the dedupe key, which starts with the time
    assert "SEARCH telemetry USING INDEX sqlite_autoindex_telemetry_1 (time<?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan  # the index gives the order too


def _message(device_id: str, seq: int, at: str, model: str) -> bytes:
    stats = {"model": model, "version": 1, "requests": seq, "errors": 0, "rows": seq, "batches": 1}
    doc = {"device_id": device_id, "seq": seq, "time": at, "window_s": 10.0, "models": [stats]}
    return json.dumps(doc).encode()


def test_a_devices_windows_are_a_range_of_the_time_index(db_url: str) -> None:
    """The telemetry table is indexed by time, not by device: a device's windows come from a
    range of the time index (SQLite's plan reads no table whole), and with a model version
    from that version's range of the (model, version, received_at) index."""
    migrate(db_url)
    now = datetime.now(UTC)

    async def scenario() -> dict[tuple[str | None, str | None], list[tuple[str, int, str]]]:
        engine = make_engine(db_url)
        sessions = session_factory(engine)
        ingest = Ingestor(sessions, FleetMetrics(), batch_size=100, max_delay_s=0.01)
        for seq in range(1, 5):
            at = (now - timedelta(seconds=100 - 10 * seq)).isoformat()
            for device in ("dev-a", "dev-b"):
                ingest.telemetry(device, _message(device, seq, at, "m" if seq % 2 else "n"))
        old = (now - timedelta(hours=2)).isoformat()
        ingest.telemetry("dev-a", _message("dev-a", 99, old, "m"))  # before the window
        await ingest.drain()
        out: dict[tuple[str | None, str | None], list[tuple[str, int, str]]] = {}
        async with sessions() as s:
            cases: list[tuple[str | None, str | None]] = [
                ("dev-a", None),
                ("dev-a", "m"),
                (None, "n"),
            ]
            for who, model in cases:
                query = windows(now - timedelta(hours=1), device_id=who, model=model)
                rows = (await s.scalars(query)).all()
                out[who, model] = [(r.device_id, r.seq, r.model) for r in rows]
        await engine.dispose()
        return out

    found = asyncio.run(scenario())
    newest_first = [("dev-a", 4, "n"), ("dev-a", 3, "m"), ("dev-a", 2, "n"), ("dev-a", 1, "m")]
    assert found["dev-a", None] == newest_first
    assert found["dev-a", "m"] == [("dev-a", 3, "m"), ("dev-a", 1, "m")]
    of_n = [("dev-a", 2, "n"), ("dev-a", 4, "n"), ("dev-b", 2, "n"), ("dev-b", 4, "n")]
    assert sorted(found[None, "n"]) == of_n
    if db_url.startswith("sqlite"):
        engine = create_engine(sync_url(db_url))
        plans = []
        for model, version in ((None, None), ("m", None), ("m", 1)):
            query = windows(now, device_id="dev-a", model=model, version=version)
            sql = str(query.compile(engine, compile_kwargs={"literal_binds": True}))
            with engine.connect() as conn:
                rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")
                plans.append(" | ".join(r[-1] for r in rows))
        engine.dispose()
        by_time = "SEARCH telemetry USING INDEX sqlite_autoindex_telemetry_1 (time>?)"
        assert by_time in plans[0] and by_time in plans[1], plans
        by_received = "ix_telemetry_model_received (model=? AND version=? AND received_at>?)"
        assert by_received in plans[2], plans
        assert not any("SCAN" in p for p in plans), plans
        assert not any("TEMP B-TREE" in p for p in plans), plans  # the indexes give the order


def test_telemetry_keeps_its_rows_and_dedupes_across_the_key_migration(db_url: str) -> None:
    """Revisions 0004 and 0005 move the dedupe keys to (time, device, seq, ...): rows stored
    before them stay, a redelivery of one of them is still refused, and a new one is taken."""
    engine = create_engine(sync_url(db_url))
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0003")
        conn.exec_driver_sql(
            "INSERT INTO device_telemetry (device_id, seq, time, dropped) "
            "VALUES ('dev-1', 1, '2026-12-03 07:00:00.000000', 0)"
        )
    migrate(db_url)
    with engine.begin() as conn:
        for seq, at in ((1, "2026-12-03 07:00:00.000000"), (2, "2026-12-03 07:00:10.000000")):
            conn.exec_driver_sql(
                "INSERT INTO device_telemetry (device_id, seq, time, dropped) "
                f"VALUES ('dev-1', {seq}, '{at}', 0) ON CONFLICT DO NOTHING"
            )
        stored = conn.exec_driver_sql("SELECT seq FROM device_telemetry ORDER BY seq").all()
    engine.dispose()
    assert [r[0] for r in stored] == [1, 2]


def test_windows_stored_before_received_at_count_as_received_at_their_time(db_url: str) -> None:
    """Revision 0007 adds when the control plane received each window (the health gates go by
    it): windows stored before it get their own time, which the gates went by until then, and
    the revision goes back down and up again."""
    engine = create_engine(sync_url(db_url))
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0006")
        conn.exec_driver_sql(
            "INSERT INTO telemetry (device_id, seq, time, window_s, model, version, requests, "
            'errors, "rows", batches, queue_depth) '
            "VALUES ('dev-1', 1, '2026-12-03 07:00:00.000000', 10, 'mlp', 2, 5, 1, 5, 1, 0)"
        )
    migrate(db_url)
    query = "SELECT count(*) FROM telemetry WHERE received_at = time"
    with engine.begin() as conn:
        assert conn.exec_driver_sql(query).scalar_one() == 1
        command.downgrade(alembic_config(conn), "0006")
        command.upgrade(alembic_config(conn), "head")
        assert conn.exec_driver_sql(query).scalar_one() == 1
    engine.dispose()


def test_migrations_match_the_models(db_url: str) -> None:
    migrate(db_url)
    migrate(db_url)  # idempotent
    engine = create_engine(sync_url(db_url))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == [], "models changed without a migration: alembic revision --autogenerate"


def test_grafana_dashboard_queries_exported_series() -> None:
    import json
    import re

    from control_plane.metrics import FleetMetrics

    dashboard = json.loads((Path(__file__).parents[2] / "docs/grafana-dashboard.json").read_text())
    exported = FleetMetrics().render().decode()
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            break  # the agents' panels below: tests/agent/openai/test_grafana.py
        for target in panel["targets"]:
            for name in re.findall(r"edgefleet_[a-z_]+", target["expr"]):
                assert f"# TYPE {name.removesuffix('_total')}" in exported or name in exported, name
