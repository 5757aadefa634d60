"""Enrolment's admission: a token bucket and a bound on requests in flight. Over them the
control plane answers 429 with a Retry-After that spreads the refused devices out, and the
agent's enrol client waits at least that long (with jitter) and asks again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.fleet.enrol import Enrolment, identity_path
from agent.fleet.settings import FleetSettings
from agent.fleet.state import StateFiles
from control_plane.enrolment.admission import Admission
from control_plane.provisioning.acl import CONTROL_PLANE_USER
from control_plane.provisioning.mosquitto import FleetAccess
from control_plane.settings.enrolment import AccountsKind, EnrolmentSettings
from tests.control_plane.enrolment.conftest import enrol, new_claim
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import WrittenMosquitto, free_port


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_over_the_bucket_is_told_to_come_back_spread_out() -> None:
    clock = Clock()
    gate = Admission(
        rate_per_s=2.0,
        burst_requests=2,
        max_in_flight_requests=10,
        max_retry_after_s=3.0,
        clock=clock,
    )
    assert gate.try_enter() is None and gate.try_enter() is None  # the burst
    # refused: each a later slot, 0.5 s apart at 2/s, told in whole seconds, at least 1
    assert [gate.try_enter() for _ in range(8)] == [1, 1, 2, 2, 3, 3, 3, 3]  # capped at 3
    assert gate.refused == 8
    clock.now += 1.0  # two tokens back
    assert gate.try_enter() is None and gate.try_enter() is None
    assert gate.try_enter() is not None


def test_requests_in_flight_are_bounded_and_slow_answers_widen_the_slots() -> None:
    clock = Clock()
    gate = Admission(
        rate_per_s=1000.0,
        burst_requests=1000,
        max_in_flight_requests=2,
        max_retry_after_s=60.0,
        clock=clock,
    )
    assert gate.try_enter() is None and gate.try_enter() is None
    assert gate.try_enter() == 1  # two in flight already
    for _ in range(100):  # answers take 4 s each: 2 in flight admit one every 2 s
        gate.leave(4.0)
        assert gate.try_enter() is None
    waits = [gate.try_enter() for _ in range(5)]
    assert waits == sorted(waits) and waits[-1] is not None and waits[-1] >= 9


@pytest.fixture
def limited_cp(tmp_path: Path, dynsec_broker: WrittenMosquitto) -> Iterator[RunningControlPlane]:
    """One enrolment every 2 s, one at a time."""
    with control_plane(
        tmp_path / "cp-state",
        f"sqlite+aiosqlite:///{tmp_path}/cp.db",
        dynsec_broker.control_plane_url,
        free_port(),
        mqtt_username=CONTROL_PLANE_USER,
        mqtt_password_file=FleetAccess(tmp_path / "cp-state").service().password_file,
        enrolment=EnrolmentSettings(
            accounts=AccountsKind.DYNSEC,
            admit_rate_per_s=0.5,
            admit_burst_requests=1,
            max_in_flight_requests=1,
        ),
    ) as running:
        yield running


@pytest.mark.slow
def test_over_the_rate_the_agent_is_told_to_wait_and_enrols_after(
    limited_cp: RunningControlPlane,
    dynsec_broker: WrittenMosquitto,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = new_claim(limited_cp, max_uses=5)
    assert enrol(limited_cp, token, "dev-1").status_code == 201  # the bucket's one token
    refused = enrol(limited_cp, token, "dev-2")
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "rate_limited"
    assert int(refused.headers["retry-after"]) >= 1

    def bogus() -> int:
        return httpx.post(
            f"{limited_cp.url}/api/v1/enrol",
            json={},
            headers={"Authorization": "Bearer efc_nope_nope"},
        ).status_code

    # an unknown claim costs a token too (the gate comes before any lookup): spend the one
    # that came back meanwhile, so the agent below is refused first
    while (status := bogus()) != 429:
        assert status == 401

    state_dir = tmp_path / "agent-state"
    settings = FleetSettings(
        mqtt_url=dynsec_broker.url,
        device_id="dev-3",
        state_dir=state_dir,
        enrol_url=limited_cp.url,
        claim_token=token,
        reconnect_min_s=0.05,
    )
    state_dir.mkdir()
    caplog.set_level(logging.INFO, logger="edgefleet.agent.fleet.enrol")
    identity = asyncio.run(
        asyncio.wait_for(Enrolment(settings, StateFiles(state_dir), "raspberry-pi-5").run(), 60)
    )
    assert identity.username == "dev-3" and identity_path(state_dir).is_file()
    # it was refused at least once, and waited no less than it was told each time (its log
    # says both)
    busy = [r for r in caplog.records if r.getMessage() == "enrolment: control plane busy"]
    assert busy, "the agent was never told to wait"
    for record in busy:
        told, waited = record.__dict__["retry_after_s"], record.__dict__["retry_in_s"]
        assert told >= 1 and told <= waited <= told * 1.5
