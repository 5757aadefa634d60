"""Maintenance windows: the cron reading (time zones, daylight saving, cron's day rule), and a
rollout whose device waits, pending with the reason, until one of its windows is open."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from control_plane.rollouts.windows import Cron, Window
from runtimes.examples.variants import mlp_version
from tests.agent.fleet.conftest import AgentFactory
from tests.agent.fleet.publisher import Fleet
from tests.agent.server import wait_until
from tests.control_plane.enrolment.conftest import ClaimedAgent, new_claim
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_rollouts import push, served, validate


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_a_window_follows_its_time_zone_through_daylight_saving() -> None:
    nightly = Window.of("nightly", "0 2 * * *", 3600, "Europe/Paris")
    # 02:00-03:00 in Paris: 01:00 UTC in winter (CET), 00:00 UTC in summer (CEST)
    assert nightly.is_open(utc(2026, 1, 10, 1, 30))
    assert not nightly.is_open(utc(2026, 1, 10, 0, 30))
    assert nightly.is_open(utc(2026, 7, 1, 0, 30))
    assert not nightly.is_open(utc(2026, 7, 1, 1, 30))
    assert nightly.next_start(utc(2026, 7, 1, 1, 30)) == utc(2026, 7, 2, 0, 0)
    # 25 October: 02:00 comes twice (03:00 CEST falls back to 02:00 CET); the first is taken
    assert nightly.next_start(utc(2026, 10, 24, 12, 0)) == utc(2026, 10, 25, 0, 0)
    assert nightly.next_start(utc(2026, 10, 25, 12, 0)) == utc(2026, 10, 26, 1, 0)  # CET
    late = Window.of("late", "30 23 * * *", 7200, "UTC")  # open across midnight
    assert late.is_open(utc(2026, 5, 2, 1, 0)) and not late.is_open(utc(2026, 5, 2, 1, 30))


def test_cron_fields_and_the_day_rule() -> None:
    office = Window.of("office", "*/15 9-17 * * 1-5", 600, "UTC")
    friday_evening = utc(2026, 12, 4, 17, 50)  # a Friday
    assert office.next_start(friday_evening) == utc(2026, 12, 7, 9, 0)  # Monday
    assert office.is_open(utc(2026, 12, 7, 9, 5)) and not office.is_open(utc(2026, 12, 7, 9, 10))
    # both day fields restricted: the 1st of the month or a Monday, as cron reads them
    either = Cron.parse("0 3 1 * 1")
    assert either.day_matches(datetime(2026, 12, 1).date())  # a Tuesday, the 1st
    assert either.day_matches(datetime(2026, 12, 7).date())  # a Monday
    assert not either.day_matches(datetime(2026, 12, 8).date())
    assert Cron.parse("0 0 * * 7").weekdays == frozenset({0})  # Sunday, 0 or 7
    assert Cron.parse("5/20 * * * *").minutes == frozenset({5, 25, 45})


@pytest.mark.parametrize(
    ("cron", "duration_s", "zone", "message"),
    [
        ("61 * * * *", 60, "UTC", "minute '61': outside 0-59"),
        ("* * *", 60, "UTC", "five fields"),
        ("* x * * *", 60, "UTC", "hour 'x'"),
        ("* * * * *", 0, "UTC", "duration_s"),
        ("* * * * *", 60, "Mars/Olympus", "not an IANA time zone"),
    ],
)
def test_bad_windows_are_refused_by_name(
    cron: str, duration_s: float, zone: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Window.of("w", cron, duration_s, zone)


@pytest.mark.slow
def test_a_wave_waits_for_its_devices_window(
    cp: RunningControlPlane, claimed_agent: ClaimedAgent, tmp_path: Path
) -> None:
    for version in (2, 3):
        push(cp.admin, "mlp", version, [(mlp_version(tmp_path / f"v{version}", seed=version), [])])
        assert validate(cp.admin, "mlp", version)["passed"]
    edge = {"selector": {"site": "edge"}, "duration_s": 60, "timezone": "Asia/Tokyo"}

    def window(name: str, cron: str) -> dict[str, object]:
        resp = cp.admin.post(
            "/api/v1/maintenance-windows", json={"name": name, "cron": cron, **edge}
        )
        assert resp.status_code == 201, resp.text
        return resp.json()  # type: ignore[no-any-return]

    def roll_out(version: int) -> str:
        spec = {"model": "mlp", "version": version, "selector": {"site": "edge"}, "waves": ["100%"]}
        gates = {"bake_time_s": 0.2, "gates": {"allow_unjudged": True}}
        resp = cp.admin.post("/api/v1/rollouts", json={**spec, **gates})
        assert resp.status_code == 201, resp.text
        return f"/api/v1/rollouts/{resp.json()['id']}"

    assert window("edge-never", "0 0 30 2 *")["next_open"] is None  # 30 February
    bad = cp.admin.post(
        "/api/v1/maintenance-windows", json={"name": "x", "cron": "* 24 * * *", **edge}
    )
    assert bad.status_code == 400 and "hour '24'" in bad.json()["error"]
    with claimed_agent("dev-w", new_claim(cp, labels={"site": "edge"})) as agent:
        wait_until(
            lambda: cp.admin.get("/api/v1/devices/dev-w").json().get("online"),
            what="the device online",
        )
        rollout = roll_out(2)
        (device,) = cp.admin.get(rollout).json()["devices"]
        assert (device["state"], device["reason"]) == (
            "pending",
            "waiting for maintenance window edge-never (never opens)",
        )
        assert served(agent) == "1"
        # another window of the device, open now: it starts at the rollout's next step
        assert window("edge-now", "* * * * *")["open_now"] is True
        wait_until(
            lambda: cp.admin.get(rollout).json()["state"] == "succeeded",
            timeout_s=60,
            what="the rollout to succeed once a window opened",
        )
        assert served(agent) == "2"

        # a window opening later: the device downloads ahead and switches only then
        assert cp.admin.delete("/api/v1/maintenance-windows/edge-now").status_code == 204
        later = (datetime.now(UTC) + timedelta(minutes=30)).minute
        opens = window("edge-later", f"{later} * * * *")["next_open"]
        rollout = roll_out(3)
        (device,) = cp.admin.get(rollout).json()["devices"]
        assert device["state"] == "sent"
        assert device["reason"] == (
            f"downloading ahead of maintenance window edge-later: switches at {opens}"
        )
        wait_until(
            lambda: (agent.state.manager.repository / "mlp" / "3" / "model.onnx").is_file(),
            what="version 3 downloaded ahead",
        )
        assert served(agent) == "2"


@pytest.mark.slow
def test_a_device_downloads_ahead_and_switches_when_its_window_opens(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    v2 = mlp_version(tmp_path / "v2", seed=7)
    with fleet_agent() as agent:
        opens = datetime.now(UTC) + timedelta(seconds=2)
        manifest = {**fleet.manifest("mlp", 2, 1, v2), "activate_after": opens.isoformat()}
        fleet.publish_desired("dev-1", fleet.sign(manifest))
        verified = fleet.wait_event("dev-1", "verified", sequence=1)
        assert verified.reason is not None and verified.reason.startswith("switches at")
        assert verified.time < opens  # downloaded and verified before the window
        fleet.wait_event("dev-1", "committed", sequence=1)
        staged = fleet.wait_event("dev-1", "staged", sequence=1)
        assert staged.time >= opens  # loaded and switched to only once it opened
        assert served(agent) == "2"
