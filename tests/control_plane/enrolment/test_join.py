"""A device with only a claim joins: it gets its broker identity and the trust root, keeps them,
and its broker user may publish to its own topics only. With approval required, it waits,
listed as pending, until an operator approves it."""

from __future__ import annotations

import asyncio
import json
import stat

import pytest

from agent.fleet.enrol import identity_path, load_identity
from common.protocol.topics import Topics
from control_plane.mqtt.codec import MqttError
from control_plane.mqtt.wire import connect
from tests.agent.server import wait_until
from tests.control_plane.enrolment.conftest import ClaimedAgent, enrol, new_claim
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_mqttwire import Inbox, close_and_wait
from tests.mqtt_broker import WrittenMosquitto


def online(cp: RunningControlPlane, device_id: str) -> bool:
    resp = cp.admin.get(f"/api/v1/devices/{device_id}")
    return resp.status_code == 200 and bool(resp.json()["online"])


@pytest.mark.slow
def test_a_device_with_only_a_claim_joins(
    cp: RunningControlPlane, claimed_agent: ClaimedAgent
) -> None:
    token = new_claim(cp, max_uses=1, labels={"group": "pi"})
    with claimed_agent("dev-z", token) as agent:
        wait_until(lambda: online(cp, "dev-z"), what="the claimed device online")
        state_dir = agent.state.settings.fleet.state_dir
    device = cp.admin.get("/api/v1/devices/dev-z").json()
    assert device["labels"]["group"] == "pi"  # the claim's label, an operator label
    assert device["trust_root_version"] == 1
    identity = identity_path(state_dir)
    assert stat.S_IMODE(identity.stat().st_mode) == 0o600
    assert json.loads(identity.read_text())["username"] == "dev-z"
    assert load_identity(state_dir, "dev-z") is not None
    assert load_identity(state_dir, "dev-renamed") is None  # renamed: it enrols anew
    (claim,) = cp.admin.get("/api/v1/claims").json()
    assert (claim["uses"], claim["state"]) == (1, "used_up")
    issued = cp.admin.get("/api/v1/enrolments").json()[0]["issued_at"]
    # Later starts use what it stored: with the claim revoked, it still joins, asking nothing.
    cp.admin.post(f"/api/v1/claims/{claim['id']}/revoke")
    wait_until(lambda: not online(cp, "dev-z"), what="the device offline")
    with claimed_agent("dev-z", token):
        wait_until(lambda: online(cp, "dev-z"), what="the device online again")
    assert cp.admin.get("/api/v1/enrolments").json()[0]["issued_at"] == issued


@pytest.mark.slow
def test_a_claimed_device_publishes_to_its_own_topics_only(
    cp: RunningControlPlane, dynsec_broker: WrittenMosquitto
) -> None:
    token = new_claim(cp, max_uses=2)
    password = enrol(cp, token, "dev-a").json()["password"]
    assert enrol(cp, token, "dev-b").status_code == 201
    topics = Topics()

    async def scenario() -> None:
        host, port = "127.0.0.1", dynsec_broker.port
        conn = await connect(
            host, port, "edgefleet-agent-dev-a", Inbox(), username="dev-a", password=password
        )
        await conn.publish(topics.telemetry("dev-a"), b"{}")
        await conn.subscribe([(topics.desired("dev-a"), 1), (topics.trust, 1)])
        for leaf in ("telemetry", "status", "events", "desired"):
            with pytest.raises(MqttError, match="0x87 not authorized"):
                await conn.publish(topics.device("dev-b", leaf), b"{}")
        with pytest.raises(MqttError, match="0x87 not authorized"):
            await conn.subscribe([(topics.desired("dev-b"), 1)])
        with pytest.raises(MqttError, match="0x87 not authorized"):
            await conn.subscribe([(topics.all_devices("telemetry"), 1)])
        await close_and_wait(conn)
        # its login is bound to its own client id: another device's session is not for it
        with pytest.raises(MqttError, match="refused"):
            await connect(
                host, port, "edgefleet-agent-dev-b", Inbox(), username="dev-a", password=password
            )

    asyncio.run(asyncio.wait_for(scenario(), 60))
    # rejected once enrolled: its broker user is gone, and it cannot collect another
    resp = cp.admin.post("/api/v1/enrolments/dev-a/reject", json={"reason": "stolen"})
    assert resp.status_code == 200 and resp.json()["state"] == "rejected", resp.text

    async def refused() -> None:
        with pytest.raises(MqttError, match="refused"):
            await connect(
                "127.0.0.1",
                dynsec_broker.port,
                "edgefleet-agent-dev-a",
                Inbox(),
                username="dev-a",
                password=password,
            )

    asyncio.run(asyncio.wait_for(refused(), 60))
    again = enrol(cp, token, "dev-a")
    assert (again.status_code, again.json()["reason"]) == (403, "rejected")


@pytest.mark.slow
def test_approval_holds_a_device_until_an_operator_approves(
    cp: RunningControlPlane, claimed_agent: ClaimedAgent
) -> None:
    token = new_claim(cp, max_uses=5, require_approval=True)
    with claimed_agent("dev-p", token):
        wait_until(
            lambda: (
                [e["device_id"] for e in cp.admin.get("/api/v1/enrolments?state=pending").json()]
                == ["dev-p"]
            ),
            what="the device listed as pending",
        )
        assert cp.admin.get("/api/v1/devices/dev-p").status_code == 404  # not in the fleet yet
        resp = cp.admin.post("/api/v1/enrolments/dev-p/approve", json={"reason": "known box"})
        assert resp.status_code == 200 and resp.json()["state"] == "approved", resp.text
        wait_until(lambda: online(cp, "dev-p"), what="the approved device online")
    assert cp.admin.get("/api/v1/enrolments").json()[0]["state"] == "enrolled"
    # a rejected device is told so when it asks again
    assert enrol(cp, token, "dev-q").status_code == 202
    resp = cp.admin.post("/api/v1/enrolments/dev-q/reject", json={"reason": "unknown serial"})
    assert resp.json()["state"] == "rejected"
    resp = enrol(cp, token, "dev-q")
    assert (resp.status_code, resp.json()["reason"]) == (403, "rejected")
    assert "unknown serial" in resp.json()["error"]
    again = cp.admin.post("/api/v1/enrolments/dev-q/approve", json={})
    assert again.status_code == 409, again.text
