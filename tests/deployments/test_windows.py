"""Maintenance windows: the cron reading (time zones, daylight saving, cron's day rule), and a
rollout whose device waits, pending with the reason, until one of its windows is open."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from control_plane.rollouts.windows import Cron, Window
from runtimes.examples.variants import mlp_version
from tests.agent.server import wait_until
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_rollouts import push, served, validate
from tests.enrolment.conftest import ClaimedAgent, new_claim


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
    push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
    assert validate(cp.admin, "mlp", 2)["passed"]
    later = (datetime.now(UTC) + timedelta(minutes=30)).minute
    closed = {"selector": {"site": "edge"}, "duration_s": 60, "timezone": "Asia/Tokyo"}
    resp = cp.admin.post(
        "/api/v1/maintenance-windows",
        json={"name": "edge-later", "cron": f"{later} * * * *", **closed},
    )
    assert resp.status_code == 201, resp.text
    assert resp.json()["open_now"] is False
    bad = cp.admin.post(
        "/api/v1/maintenance-windows", json={"name": "x", "cron": "* 24 * * *", **closed}
    )
    assert bad.status_code == 400 and "hour '24'" in bad.json()["error"]

    with claimed_agent("dev-w", new_claim(cp, labels={"site": "edge"})) as agent:
        wait_until(
            lambda: cp.admin.get("/api/v1/devices/dev-w").json().get("online"),
            what="the device online",
        )
        spec = {"model": "mlp", "version": 2, "selector": {"site": "edge"}, "waves": ["100%"]}
        resp = cp.admin.post(
            "/api/v1/rollouts", json={**spec, "bake_time_s": 0.2, "gates": {"allow_unjudged": True}}
        )
        assert resp.status_code == 201, resp.text
        rollout = f"/api/v1/rollouts/{resp.json()['id']}"
        (device,) = cp.admin.get(rollout).json()["devices"]
        assert device["state"] == "pending"
        assert device["reason"].startswith("waiting for maintenance window edge-later (opens ")
        assert served(agent) == "1"
        # another window of the device open now: it may start
        resp = cp.admin.post(
            "/api/v1/maintenance-windows",
            json={"name": "edge-now", "cron": "* * * * *", **closed},
        )
        assert resp.json()["open_now"] is True
        wait_until(
            lambda: cp.admin.get(rollout).json()["state"] == "succeeded",
            timeout_s=60,
            what="the rollout to succeed once the window opened",
        )
        assert served(agent) == "2"
