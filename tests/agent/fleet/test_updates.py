"""Signed updates end to end: a real Mosquitto, a real agent, a real artifact server."""

from __future__ import annotations

import threading
import time
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import pytest

from agent.fleet.updater import RETRY_BASE_S
from common.protocol.messages import DeviceStatus
from common.protocol.signing import SigningKey
from common.protocol.verify import CLOCK_SKEW
from runtimes.examples.reference import mlp_forward
from runtimes.examples.variants import fragile_mlp_version, mlp_version
from runtimes.examples.weights import mlp_layers
from tests.agent.fleet.artifacts import Fault
from tests.agent.fleet.conftest import AgentFactory
from tests.agent.fleet.publisher import Fleet
from tests.agent.server import RunningAgent

X = np.random.default_rng(5).standard_normal((3, 256)).astype(np.float32)


def infer(agent: RunningAgent, x: np.ndarray = X) -> httpx.Response:
    return agent.client.post(
        "/v2/models/mlp/infer",
        json={
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.ravel().tolist(),
                }
            ]
        },
    )


def served(agent: RunningAgent) -> tuple[str, np.ndarray]:
    resp = infer(agent)
    assert resp.status_code == 200, resp.text
    out = resp.json()["outputs"][0]
    return resp.json()["model_version"], np.array(out["data"], np.float32).reshape(out["shape"])


@pytest.mark.slow
def test_good_update_is_committed_and_the_new_version_answers(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    v2 = mlp_version(tmp_path / "v2", seed=99)
    with fleet_agent() as agent:
        assert served(agent)[0] == "1"
        fleet.publish_desired(
            "dev-1",
            fleet.sign(fleet.manifest("mlp", 2, 1, v2, config={"batching": {"max_batch_size": 8}})),
        )
        fleet.wait_event("dev-1", "committed", sequence=1)
        version, out = served(agent)
        assert version == "2"
        np.testing.assert_allclose(out, mlp_forward(X, mlp_layers(99)), rtol=1e-4, atol=1e-4)
        states = [e.state.value for e in fleet.events("dev-1") if e.sequence == 1]
        assert [s for s in states if s != "downloading"] == [
            "received",
            "verified",
            "staged",
            "active",
            "committed",
        ]
        assert "downloading" in states

        def births_with_version_2() -> list[DeviceStatus]:
            births = [s for s in fleet.statuses("dev-1") if s.online]
            return [s for s in births if any(m.version == 2 for m in s.models)]

        status = fleet.wait(births_with_version_2, what="a birth message with version 2")[-1]
        assert status.hardware_profile == "generic-x86_64" and status.labels == {"site": "lab"}
        assert [(m.model, m.version, m.sequence) for m in status.models] == [("mlp", 2, 1)]
        config = tomllib.loads((agent.state.manager.repository / "mlp/config.toml").read_text())
        assert config["version_policy"] == {"specific": [2]} and config["batching"] == {
            "max_batch_size": 8
        }
        assert (
            agent.client.get("/v2/models/mlp/config").json()["edgefleet"]["batching"][
                "max_batch_size"
            ]
            == 8
        )


def test_a_desired_state_it_already_runs_makes_it_say_so_again(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    """A new leader publishes every device's desired state again as it takes the lease; the
    status saying a device committed may have died unstored with the old leader (issue 47):
    the device sends it again, and rejects nothing as a replay."""
    desired = fleet.sign(fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=99)))

    def on_v2() -> list[DeviceStatus]:
        online = [s for s in fleet.statuses("dev-1") if s.online]
        return [s for s in online if any(m.version == 2 for m in s.models)]

    with fleet_agent():
        fleet.publish_desired("dev-1", desired)
        fleet.wait_event("dev-1", "committed", sequence=1)
        before = len(fleet.wait(on_v2, what="a status with version 2"))
        fleet.publish_desired("dev-1", desired)
        fleet.wait(lambda: len(on_v2()) > before, what="the status again")
        assert not [e for e in fleet.events("dev-1") if e.code == "replayed"]


@pytest.mark.slow
def test_update_over_mqtt_3_1_1(fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path) -> None:
    with fleet_agent(mqtt_protocol="3.1.1") as agent:
        fleet.publish_desired(
            "dev-1", fleet.sign(fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=99)))
        )
        fleet.wait_event("dev-1", "committed", sequence=1)
        assert served(agent)[0] == "2"


REJECTIONS = """
    bad_signature unknown_key revoked_key expired replayed wrong_target
    digest_mismatch size_mismatch oversize no_artifact
""".split()


@pytest.mark.slow
@pytest.mark.parametrize("case", REJECTIONS)
def test_bad_update_is_rejected_with_its_reason_and_the_old_version_keeps_serving(
    case: str, fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    v2 = mlp_version(tmp_path / "v2", seed=99)
    overrides = {"max_artifact_bytes": 1000} if case == "oversize" else {}
    with fleet_agent(**overrides) as agent:
        sequence = 5
        payload = fleet.manifest("mlp", 2, sequence, v2)
        key = fleet.manifest_key
        if case == "replayed":  # apply sequence 5 first, then offer sequence 4
            fleet.publish_desired("dev-1", fleet.sign(payload))
            fleet.wait_event("dev-1", "committed", sequence=5)
            sequence = 4
            payload = fleet.manifest("mlp", 3, sequence, mlp_version(tmp_path / "v3", seed=7))
        elif case == "unknown_key":
            key = SigningKey.generate()
        elif case == "revoked_key":
            fleet.publish_trust(
                fleet.trust_root(version=2, revoked=[key.key_id]).model_copy(
                    update={"manifest_keys": [key.public(), SigningKey.generate().public()]}
                )
            )
            fleet.wait(
                lambda: agent.state.fleet is not None and agent.state.fleet.trust.version == 2,
                what="trust v2",
            )
        elif case == "expired":
            issued = datetime.now(UTC) - timedelta(days=2)
            payload = fleet.manifest(
                "mlp", 2, sequence, v2, issued_at=issued, expires_in=timedelta(days=1)
            )
        elif case == "wrong_target":
            payload["target"] = {"labels": {"site": "elsewhere"}}
        elif case == "no_artifact":
            payload["artifacts"][0]["profiles"] = ["raspberry-pi-5"]
        elif case == "digest_mismatch":
            ref = payload["artifacts"][0]["files"][0]
            data = bytearray(Path(fleet.artifacts.root / ref["sha256"]).read_bytes())
            data[100] ^= 0xFF  # same size, one byte flipped in transit
            fleet.artifacts.faults[ref["sha256"]] = Fault(serve_bytes=bytes(data), times=100)
        elif case == "size_mismatch":  # a truncated artifact, served completely and cleanly
            ref = payload["artifacts"][0]["files"][0]
            data = Path(fleet.artifacts.root / ref["sha256"]).read_bytes()
            fleet.artifacts.faults[ref["sha256"]] = Fault(
                serve_bytes=data[: len(data) // 2], times=100
            )
        envelope = fleet.sign(payload, key)
        if case == "bad_signature":
            envelope["signed"]["version"] = 3  # changed after signing
        fleet.publish_desired("dev-1", envelope)
        event = fleet.wait_event("dev-1", "rejected", sequence=sequence)
        assert event.code == case, event
        assert event.reason
        expected_version = "2" if case == "replayed" else "1"
        assert served(agent)[0] == expected_version
        assert agent.client.get("/v2/health/ready").status_code == 200
        metrics = agent.client.get("/metrics").text
        if case in (
            "bad_signature",
            "unknown_key",
            "revoked_key",
            "expired",
            "replayed",
            "wrong_target",
            "no_artifact",
        ):
            assert (
                f'edgefleet_fleet_messages_rejected_total{{code="{case}",topic="desired"}} 1.0'
                in metrics
            )
        staging = agent.state.manager.repository / ".staging"
        assert not [p for p in staging.iterdir() if p.suffix == ".part"], (
            "a failed download left a partial file"
        )


@pytest.mark.slow
def test_self_test_failure_rolls_back(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    v2 = mlp_version(tmp_path / "v2", seed=99)
    mlp_version(tmp_path / "other", seed=1)
    (v2 / "golden.npz").write_bytes(
        (tmp_path / "other/golden.npz").read_bytes()
    )  # expects another model's answer
    with fleet_agent() as agent:
        fleet.publish_desired("dev-1", fleet.sign(fleet.manifest("mlp", 2, 1, v2)))
        event = fleet.wait_event("dev-1", "rolled_back", sequence=1)
        assert event.code == "self_test_failed" and "differs" in (event.reason or "")
        assert served(agent)[0] == "1"
        assert "active" not in [e.state.value for e in fleet.events("dev-1")]


@pytest.mark.slow
def test_health_window_failure_rolls_back(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    v2 = fragile_mlp_version(tmp_path / "v2", seed=99)
    health = {"window_s": 30, "min_requests": 10, "max_error_rate": 0.05}
    with fleet_agent() as agent:
        fleet.publish_desired("dev-1", fleet.sign(fleet.manifest("mlp", 2, 1, v2, health=health)))
        fleet.wait_event("dev-1", "active", sequence=1)
        poison = X.copy()
        poison[:, 0] = 500.0  # traffic version 1 handles and version 2 fails on
        codes = [infer(agent, poison).status_code for _ in range(15)]
        assert 500 in codes
        event = fleet.wait_event("dev-1", "rolled_back", sequence=1)
        assert event.code == "health_check_failed" and "error rate" in (event.reason or "")
        version, _ = served(agent)
        assert version == "1"
        assert infer(agent, poison).status_code == 200
        state = agent.state.fleet.state.models["mlp"]  # type: ignore[union-attr]
        assert state.failed_sequence == 1 and state.committed_sequence is None
        # the retained desired state comes again on every reconnect: it is not retried
        fleet.publish_desired("dev-1", fleet.sign(fleet.manifest("mlp", 2, 1, v2, health=health)))
        fleet.publish_desired(
            "dev-1", fleet.sign(fleet.manifest("mlp", 3, 2, mlp_version(tmp_path / "v3", seed=3)))
        )
        fleet.wait_event("dev-1", "committed", sequence=2)
        assert [e.state.value for e in fleet.events("dev-1") if e.sequence == 1].count(
            "received"
        ) == 1


@pytest.mark.slow
def test_fleet_rollback_command_returns_to_the_previous_committed_version(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    with fleet_agent() as agent:
        signed = {}
        for version, seq in ((2, 1), (3, 2)):
            signed[version] = fleet.sign(
                fleet.manifest(
                    "mlp", version, seq, mlp_version(tmp_path / f"v{version}", seed=version)
                )
            )
            fleet.publish_desired("dev-1", signed[version])
            fleet.wait_event("dev-1", "committed", sequence=seq)
        assert served(agent)[0] == "3"
        fleet.command("dev-1", "mlp")
        event = fleet.wait_event("dev-1", "rolled_back")
        assert event.code == "fleet_command" and event.version == 2
        assert served(agent)[0] == "2"
        # the control plane restores the desired state to v2's manifest, an older sequence than
        # v3's: it is what runs, not a replay (it once raised "rejected (replayed)" every time)
        fleet.publish_desired("dev-1", signed[2])
        fleet.command("dev-1", "mlp", key=SigningKey.generate())  # an unsigned-by-us command
        rejected = fleet.wait(
            lambda: [e for e in fleet.events("dev-1") if e.code == "unknown_key"], what="refusal"
        )
        assert rejected and served(agent)[0] == "2"
        assert not [e for e in fleet.events("dev-1") if e.code == "replayed"]
        # and v3's manifest, retained somewhere, is not taken again: the floor did not move
        fleet.publish_desired("dev-1", signed[3])
        fleet.command("dev-1", "mlp", key=SigningKey.generate())
        fleet.wait(
            lambda: len([e for e in fleet.events("dev-1") if e.code == "unknown_key"]) == 2,
            what="the second refusal",
        )
        assert served(agent)[0] == "2"
        received = [e for e in fleet.events("dev-1") if e.state == "received" and e.sequence == 2]
        assert len(received) == 1


@pytest.mark.slow
def test_key_rotation_then_an_update_signed_with_the_new_key(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    new_key = SigningKey.generate()
    with fleet_agent() as agent:
        # step 1: announce the new key beside the old one, signed by the root key
        fleet.publish_trust(
            fleet.trust_root(version=2).model_copy(
                update={"manifest_keys": [fleet.manifest_key.public(), new_key.public()]}
            )
        )
        fleet.wait(lambda: agent.state.fleet.trust.version == 2, what="trust root v2")  # type: ignore[union-attr]
        fleet.wait(  # and says so: a new status, so the fleet sees which root it holds
            lambda: [s for s in fleet.statuses("dev-1") if s.online and s.trust_root_version == 2],
            what="a status with trust root v2",
        )
        fleet.publish_desired(
            "dev-1",
            fleet.sign(fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=2)), new_key),
        )
        fleet.wait_event("dev-1", "committed", sequence=1)
        # step 2: retire the old key; an update it signs is refused
        fleet.publish_trust(
            fleet.trust_root(version=3, revoked=[fleet.manifest_key.key_id]).model_copy(
                update={"manifest_keys": [new_key.public()]}
            )
        )
        fleet.wait(lambda: agent.state.fleet.trust.version == 3, what="trust root v3")  # type: ignore[union-attr]
        fleet.publish_desired(
            "dev-1", fleet.sign(fleet.manifest("mlp", 3, 2, mlp_version(tmp_path / "v3", seed=3)))
        )
        assert fleet.wait_event("dev-1", "rejected", sequence=2).code == "revoked_key"
        # a trust update signed by a manifest key (not a root key) is ignored
        fleet.publish_trust(
            fleet.trust_root(version=4).model_copy(
                update={"manifest_keys": [fleet.manifest_key.public()]}
            ),
            new_key,
        )
        fleet.wait(
            lambda: agent.client.get("/metrics").text.count('code="insufficient_signatures"'),
            what="refusal",
        )
        assert agent.state.fleet.trust.version == 3  # type: ignore[union-attr]
        assert served(agent)[0] == "2"


def _states(fleet: Fleet, sequence: int) -> list[str]:
    return [e.state.value for e in fleet.events("dev-1") if e.sequence == sequence]


def _deferred(fleet: Fleet) -> bool:
    """Whether dev-1 has deferred an update: its download failed, to be tried again."""
    return "download_failed" in [e.code for e in fleet.events("dev-1")]


@pytest.mark.slow
def test_a_deferred_update_redelivered_before_its_retry_is_applied_once(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    payload = fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=2))
    # the first download breaks off (one attempt per try): the update is deferred
    fleet.artifacts.faults[payload["artifacts"][0]["files"][0]["sha256"]] = Fault(
        drop_after_bytes=1000
    )
    envelope = fleet.sign(payload)
    with fleet_agent(download_attempts=1) as agent:
        fleet.publish_desired("dev-1", envelope)
        fleet.wait(lambda: _deferred(fleet), what="the deferral")
        deferred_at = time.monotonic()
        fleet.publish_desired("dev-1", envelope)  # the retained state again, as on a reconnect
        fleet.wait_event("dev-1", "committed", sequence=1)
        assert served(agent)[0] == "2"
        # Something that must not happen is waited for past its time: a second copy would
        # have run by the time the retry was due.
        time.sleep(max(0.0, deferred_at + RETRY_BASE_S + 1 - time.monotonic()))
    states = _states(fleet, 1)
    assert states.count("received") == 1 and states.count("committed") == 1, states
    assert "rejected" not in states and states[-1] == "committed", states


@pytest.mark.slow
def test_a_newer_sequence_replaces_a_deferred_one(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    old = fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=2))
    fleet.artifacts.faults[old["artifacts"][0]["files"][0]["sha256"]] = Fault(drop_after_bytes=1000)
    with fleet_agent(download_attempts=1) as agent:
        fleet.publish_desired("dev-1", fleet.sign(old))
        fleet.wait(lambda: _deferred(fleet), what="the deferral")
        deferred_at = time.monotonic()
        new = fleet.manifest("mlp", 3, 2, mlp_version(tmp_path / "v3", seed=3))
        fleet.publish_desired("dev-1", fleet.sign(new))
        fleet.wait_event("dev-1", "committed", sequence=2)
        time.sleep(max(0.0, deferred_at + RETRY_BASE_S + 1 - time.monotonic()))  # as above
        assert served(agent)[0] == "3"
    assert "rejected" not in _states(fleet, 1), fleet.events_summary()
    assert _states(fleet, 2)[-1] == "committed"


@pytest.mark.slow
def test_a_deferred_update_past_its_expiry_is_not_retried(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    issued = datetime.now(UTC) - timedelta(hours=1)
    # valid for a few more seconds on the device, which allows for clock skew
    expires_at = datetime.now(UTC) - CLOCK_SKEW + timedelta(seconds=5)
    v2 = mlp_version(tmp_path / "v2", seed=2)
    payload = fleet.manifest("mlp", 2, 1, v2, issued_at=issued, expires_in=expires_at - issued)
    hold = threading.Event()
    # held after the first 64 KiB, then broken off: deferred once the manifest has expired
    fleet.artifacts.faults[payload["artifacts"][0]["files"][0]["sha256"]] = Fault(
        hold=hold, drop_after_bytes=3 * 65536
    )
    with fleet_agent(download_attempts=1) as agent:
        fleet.publish_desired("dev-1", fleet.sign(payload))
        fleet.wait_event("dev-1", "downloading", sequence=1)
        time.sleep(max(0.0, (expires_at + CLOCK_SKEW - datetime.now(UTC)).total_seconds() + 0.1))
        hold.set()
        event = fleet.wait_event("dev-1", "rejected", sequence=1)
        assert event.code == "expired", event
        assert served(agent)[0] == "1"
    assert "download_failed" in [e.code for e in fleet.events("dev-1")]
    assert "committed" not in _states(fleet, 1)


@pytest.mark.slow
def test_a_manifest_that_trips_verification_costs_only_itself(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    naive = fleet.manifest("other", 1, 1, mlp_version(tmp_path / "other", seed=1))
    naive["issued_at"] = "2026-01-01T00:00:00"  # no time zone: once a TypeError
    good = fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=2))
    with fleet_agent() as agent:
        fleet.publish_desired("dev-1", fleet.sign(naive), fleet.sign(good))
        fleet.wait_event("dev-1", "committed", sequence=1)
        assert served(agent)[0] == "2"
    refused = [e for e in fleet.events("dev-1") if e.model == "other"]
    assert [(e.state.value, e.code) for e in refused] == [("rejected", "malformed")], refused
    assert "time zone" in (refused[0].reason or "")
