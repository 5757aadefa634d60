"""Claims refused with a clear reason, over the real API: unknown, used up, revoked, expired,
out of scope, another device's id; and the device's own exchange refusing as the agent does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from agent.fleet.enrol import Enrolment, EnrolmentFailed, load_identity
from agent.fleet.settings import FleetSettings
from agent.fleet.state import StateFiles
from tests.agent.server import wait_until
from tests.control_plane.enrolment.conftest import enrol, new_claim
from tests.control_plane.server import RunningControlPlane


def refused(resp_status: int, doc: dict[str, str], status: int, reason: str) -> None:
    assert resp_status == status, doc
    assert doc["reason"] == reason, doc
    assert doc["error"], doc  # a sentence for the operator, besides the code


@pytest.mark.slow
@pytest.mark.parametrize("cp", ["sqlite", "postgresql"], indirect=True)
def test_claims_refuse_with_a_reason(cp: RunningControlPlane) -> None:
    resp = enrol(cp, "efc_0000_nope", "dev-x")
    refused(resp.status_code, resp.json(), 401, "unknown_claim")

    once = new_claim(cp, max_uses=1, labels={"group": "pi"}, profiles=["raspberry-pi-5"])
    first = enrol(cp, once, "dev-a")
    assert first.status_code == 201, first.text
    assert first.json()["username"] == "dev-a" and first.json()["password"]
    assert first.json()["trust_root"]["signed"]["version"] == 1
    resp = enrol(cp, once, "dev-b")
    refused(resp.status_code, resp.json(), 403, "claim_used_up")
    # the device that took the use collects its identity again (the same password: the one
    # it may still hold works), others not
    again = enrol(cp, once, "dev-a")
    assert again.status_code == 201 and again.json()["password"] == first.json()["password"]
    resp = enrol(cp, once, "dev-a", device_key="another-device-key-" + "y" * 32)
    refused(resp.status_code, resp.json(), 409, "device_key_mismatch")

    wide = new_claim(cp, max_uses=10, profiles=["raspberry-pi-5"])
    resp = enrol(cp, wide, "dev-c", hardware_profile="jetson-orin")
    refused(resp.status_code, resp.json(), 403, "out_of_scope")
    assert "jetson-orin" in resp.json()["error"]
    resp = enrol(cp, wide, "edgefleet-control-plane")  # a service user's name
    refused(resp.status_code, resp.json(), 409, "device_exists")

    claim_id = wide.split("_")[1]
    assert cp.admin.post(f"/api/v1/claims/{claim_id}/revoke").json()["state"] == "revoked"
    resp = enrol(cp, wide, "dev-d")
    refused(resp.status_code, resp.json(), 403, "claim_revoked")

    brief = new_claim(cp, ttl_s=0.2)
    wait_until(
        lambda: {c["state"] for c in cp.admin.get("/api/v1/claims").json()} >= {"expired"},
        what="the claim to expire",
    )
    resp = enrol(cp, brief, "dev-e")
    refused(resp.status_code, resp.json(), 403, "claim_expired")
    assert "expired at" in resp.json()["error"]

    states = [c["state"] for c in cp.admin.get("/api/v1/claims").json()]
    assert states == ["used_up", "revoked", "expired"]  # oldest first
    assert "token" not in cp.admin.get("/api/v1/claims").json()[0]

    resp = enrol(cp, once, "a/b")
    assert resp.status_code == 400 and "device_id" in resp.json()["error"]
    with httpx.Client(base_url=cp.url) as anonymous:  # no claim: refused before the body
        resp = anonymous.post("/api/v1/enrol", content=b"{not json")
    assert (resp.status_code, resp.json()["reason"]) == (401, "unknown_claim")
    assert resp.headers["www-authenticate"] == "Bearer"
    with cp.client(cp.token("viewer")) as viewer:
        assert viewer.post("/api/v1/claims", json={"name": "x"}).status_code == 403


def test_the_agent_stops_at_a_refusal(cp: RunningControlPlane, tmp_path: Path) -> None:
    token = new_claim(cp)
    cp.admin.post(f"/api/v1/claims/{token.split('_')[1]}/revoke")
    settings = FleetSettings(
        mqtt_url="mqtt://127.0.0.1:1",
        device_id="dev-r",
        state_dir=tmp_path / "state",
        enrol_url=cp.url,
        claim_token=token,
    )
    files = StateFiles(settings.state_dir)
    with pytest.raises(EnrolmentFailed, match="claim_revoked") as failed:
        asyncio.run(Enrolment(settings, files, "raspberry-pi-5").run())
    assert failed.value.reason == "claim_revoked"
    assert load_identity(settings.state_dir, "dev-r") is None and not files.trust_path.exists()
