"""A device whose last will never reached the broker shows as silent, not online.

End to end on a real Mosquitto, a real control plane (SQLite and PostgreSQL) and a real agent:
the broker is killed while the agent runs (the will dies with it), the agent is stopped while it
waits to reconnect, and the broker comes back from its persistence still holding the birth
message. The rule itself is checked on its own below."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from control_plane.ingest.presence import Presence, SilenceRule
from control_plane.metrics import FleetMetrics
from tests.access.metrics import value
from tests.access.mqtt_client import ProbeClient
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_operations import edgefleet
from tests.control_plane.test_rollouts import wait_devices
from tests.mqtt_broker import Mosquitto

TIMEOUT_S = 2.0


def _device(cp: RunningControlPlane, device_id: str) -> dict[str, Any]:
    resp = cp.admin.get(f"/api/v1/devices/{device_id}")
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def _listed(cp: RunningControlPlane, **params: str) -> list[str]:
    resp = cp.admin.get("/api/v1/devices", params=params)
    assert resp.status_code == 200, resp.text
    return [d["id"] for d in resp.json()]


@pytest.mark.slow
def test_a_device_whose_will_never_came_is_shown_silent_then_online_again(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, broker: Mosquitto
) -> None:
    with start_control_plane(presence_timeout_s=TIMEOUT_S, last_seen_resolution_s=0.1) as cp:
        with start_agent("dev-a", cp):  # telemetry every 0.2 s
            wait_devices(cp, "dev-a")
            doc = _device(cp, "dev-a")
            assert doc["presence"] == "online" and doc["telemetry_interval_s"] == 0.2
            time.sleep(TIMEOUT_S + 1)  # past the limit: a device that keeps talking stays online
            assert _device(cp, "dev-a")["presence"] == "online"
            broker.stop(kill=True)  # its connection to the agent, and the will, die with it
        # the agent was stopped while it waited to reconnect: it could not say goodbye
        broker.start()  # from its persistence, which holds the birth message
        watcher = ProbeClient(broker.port)
        try:
            assert watcher.connect() == 0
            watcher.subscribe("edgefleet/devices/dev-a/status")
            retained = watcher.wait(
                lambda: watcher.messages("edgefleet/devices/dev-a/status"), "the retained status"
            )
            assert json.loads(retained[-1])["online"] is True  # what the broker still says
        finally:
            watcher.close()

        wait_until(
            lambda: _device(cp, "dev-a")["presence"] == "silent",
            timeout_s=60,
            what="dev-a silent",
        )
        assert _device(cp, "dev-a")["online"] is False
        assert _listed(cp, online="true") == []
        assert _listed(cp, online="false") == ["dev-a"]
        assert _listed(cp, presence="silent") == ["dev-a"]
        assert _listed(cp, presence="offline") == []
        exposition = cp.admin.get("/metrics").text
        assert value(exposition, "edgefleet_devices_silent") == 1
        assert value(exposition, "edgefleet_devices_online") == 0
        bad = cp.admin.get("/api/v1/devices", params={"presence": "away"})
        assert bad.status_code == 400 and "presence" in bad.text
        listed = edgefleet(cp, cp.token("viewer"), "devices", "list", "--silent")
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split()[:2] == ["dev-a", "silent"], listed.stdout

        with start_agent("dev-a", cp):  # heard again: online
            wait_devices(cp, "dev-a")
            assert _listed(cp, presence="silent") == []
            wait_until(
                lambda: value(cp.admin.get("/metrics").text, "edgefleet_devices_online") == 1,
                what="the online gauge",
            )


NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
RULE = SilenceRule(timeout_s=60, resolution_s=5)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("online", "last_seen", "interval_s", "hearing_since", "expected"),
    [
        (False, ago(1), 10.0, ago(3600), Presence.OFFLINE),
        (False, ago(3600), 10.0, ago(7200), Presence.OFFLINE),  # offline is never silent
        (True, ago(64), 10.0, ago(3600), Presence.ONLINE),  # within 60 s + 5 s
        (True, ago(66), 10.0, ago(3600), Presence.SILENT),
        (True, ago(66), None, ago(3600), Presence.SILENT),  # no interval announced
        # three announced intervals when longer than the timeout: 3 x 30 s + 5 s
        (True, ago(94), 30.0, ago(3600), Presence.ONLINE),
        (True, ago(96), 30.0, ago(3600), Presence.SILENT),
        # silence is counted only while the control plane listens
        (True, ago(3600), 10.0, ago(30), Presence.ONLINE),
        (True, ago(3600), 10.0, ago(70), Presence.SILENT),
        (True, None, 10.0, ago(30), Presence.ONLINE),
        (True, None, 10.0, ago(70), Presence.SILENT),
        (True, ago(3600), 10.0, None, Presence.ONLINE),  # not connected: the status stands
        # SQLite gives the UTC time back without its zone
        (True, ago(30).replace(tzinfo=None), 10.0, ago(3600), Presence.ONLINE),
        (True, ago(70).replace(tzinfo=None), 10.0, ago(3600), Presence.SILENT),
    ],
)
def test_silence_rule(
    online: bool,
    last_seen: datetime | None,
    interval_s: float | None,
    hearing_since: datetime | None,
    expected: Presence,
) -> None:
    got = RULE.presence(online, last_seen, interval_s, now=NOW, hearing_since=hearing_since)
    assert got is expected


def test_silence_check_off() -> None:
    off = SilenceRule(timeout_s=0)
    assert off.limit(10.0) is None
    assert off.presence(True, ago(86400), 10.0, now=NOW, hearing_since=ago(90000)) is (
        Presence.ONLINE
    )
    assert RULE.limit(30.0) == timedelta(seconds=95)


def test_silence_is_not_counted_while_the_control_plane_cannot_hear_or_store() -> None:
    metrics = FleetMetrics(SilenceRule(timeout_s=60))
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    metrics.set_online("dev-1", True, 10.0, hour_ago)  # its birth, an hour ago, then nothing
    metrics.set_online("dev-2", False, 10.0, hour_ago)

    def gauges() -> tuple[float, float]:
        exposition = metrics.render().decode()
        return (
            value(exposition, "edgefleet_devices_online"),
            value(exposition, "edgefleet_devices_silent"),
        )

    metrics.listening_since = metrics.storing_since = hour_ago
    assert gauges() == (0, 1)
    metrics.storing_since = None  # the database is unavailable: messages wait unstored
    assert gauges() == (1, 0)
    metrics.storing_since = datetime.now(UTC)  # back: a full limit from now
    assert metrics.hearing_since == metrics.storing_since and gauges() == (1, 0)
    metrics.storing_since = hour_ago
    metrics.listening_since = None  # the broker connection is lost
    assert metrics.hearing_since is None and gauges() == (1, 0)
    metrics.heard({"dev-1": datetime.now(UTC)}, datetime.now(UTC))
    metrics.listening_since = hour_ago
    assert gauges() == (1, 0)  # heard lately
