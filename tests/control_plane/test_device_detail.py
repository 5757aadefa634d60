"""A device's detail (``GET /api/v1/devices/{id}``, ``edgefleet devices show``): its own last
telemetry, so that an agent serving no model is seen too, and the trust root version it holds,
which the device list shows and filters by; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from common import __version__
from control_plane.db.models import Device, DeviceSample
from control_plane.db.session import sync_url
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_operations import edgefleet
from tests.control_plane.test_rollouts import wait_devices


def device(cp: RunningControlPlane, device_id: str) -> dict[str, Any]:
    resp = cp.admin.get(f"/api/v1/devices/{device_id}")
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def holding(cp: RunningControlPlane, version: int) -> list[str]:
    """The devices the list shows with trust root ``version``, as filtered by the API."""
    resp = cp.admin.get("/api/v1/devices", params={"trust_root_version": version})
    assert resp.status_code == 200, resp.text
    return [d["id"] for d in resp.json() if d["trust_root_version"] == version]


def test_an_agent_without_models_shows_its_telemetry_and_the_trust_root_it_holds(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp, models=()):
        wait_devices(cp, "dev-a")
        first = cp.admin.get("/api/v1/keys").json()["trust_root"]["version"]
        wait_until(
            lambda: device(cp, "dev-a")["last_telemetry"] is not None, what="dev-a's telemetry"
        )
        doc = device(cp, "dev-a")
        assert doc["models"] == [] and doc["agent_version"] == __version__, doc
        assert doc["trust_root_version"] == first, doc
        telemetry = doc["last_telemetry"]
        assert telemetry["seq"] >= 1 and telemetry["dropped"] == 0, telemetry
        assert telemetry["cpu_percent"] is not None and telemetry["memory_used_bytes"] > 0
        assert datetime.fromisoformat(telemetry["time"]).utcoffset() == timedelta(0)
        assert holding(cp, first) == ["dev-a"] and holding(cp, first + 1) == []

        # a new manifest key comes in trust root N+1: the device says it holds that one now
        assert cp.admin.post("/api/v1/keys/rotate").status_code == 200
        wait_until(
            lambda: device(cp, "dev-a")["trust_root_version"] == first + 1,
            what="dev-a on the rotated trust root",
        )
        assert holding(cp, first + 1) == ["dev-a"] and holding(cp, first) == []

        viewer = cp.token("viewer")
        shown = edgefleet(cp, viewer, "devices", "show", "dev-a")
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0].startswith("dev-a: online, last seen "), shown.stdout
        assert f"  agent          {__version__}" in lines
        assert f"  trust root     {first + 1}" in lines and "  models         none" in lines
        assert any(
            line.startswith("  telemetry      seq ") and line.endswith(", dropped 0")
            for line in lines
        ), shown.stdout
        assert "cpu " in shown.stdout and " MiB" in shown.stdout
        as_json = edgefleet(cp, viewer, "devices", "show", "dev-a", "--json")
        assert as_json.returncode == 0, as_json.stderr
        detail = json.loads(as_json.stdout)
        assert detail["trust_root_version"] == first + 1 and detail["last_telemetry"]["seq"] >= 1

        listed = edgefleet(cp, viewer, "devices", "list")
        assert listed.returncode == 0, listed.stderr
        columns = listed.stdout.split()
        assert columns[:5] == ["dev-a", "online", doc["hardware_profile"], "root", str(first + 1)]
        old = edgefleet(cp, viewer, "devices", "list", "--trust-root-version", str(first))
        assert old.returncode == 0 and old.stdout == "", old.stdout + old.stderr


def test_the_last_telemetry_is_the_device_s_newest_and_null_without_any(
    start_control_plane: ControlPlaneFactory, db_url: str
) -> None:
    """Among other devices' rows, newer and older; a device that never sent any shows null,
    and an agent that does not say its trust root shows none."""
    now = datetime.now(UTC)
    with start_control_plane() as cp:
        engine = create_engine(sync_url(db_url))
        with Session(engine) as s, s.begin():
            s.add_all([Device(id="dev-t"), Device(id="dev-quiet", trust_root_version=None)])
            for seq, (who, ago_s) in enumerate(
                [("dev-t", 30), ("dev-u", 25), ("dev-t", 20), ("dev-t", 10), ("dev-u", 5)],
                start=1,
            ):
                at = now - timedelta(seconds=ago_s)
                s.add(
                    DeviceSample(
                        device_id=who, seq=seq, time=at, cpu_percent=10.0 * seq, dropped=seq
                    )
                )
        engine.dispose()
        telemetry = device(cp, "dev-t")["last_telemetry"]
        assert datetime.fromisoformat(telemetry.pop("time")) == now - timedelta(seconds=10)
        assert telemetry == {
            "seq": 4,
            "cpu_percent": 40.0,
            "memory_used_bytes": None,
            "temperature_c": None,
            "dropped": 4,
        }
        quiet = device(cp, "dev-quiet")
        assert quiet["last_telemetry"] is None and quiet["trust_root_version"] is None

        shown = edgefleet(cp, cp.token("viewer"), "devices", "show", "dev-quiet")
        assert shown.returncode == 0, shown.stderr
        assert "  trust root     ?" in shown.stdout.splitlines()
        assert shown.stdout.splitlines()[-1] == "  telemetry      none yet", shown.stdout
        missing = edgefleet(cp, cp.token("viewer"), "devices", "show", "no/such?device#")
        assert missing.returncode == 1 and "404" in missing.stderr, missing.stderr
        assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
