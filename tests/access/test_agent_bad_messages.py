"""Garbage on every topic the agent subscribes to (desired state, commands, trust root), on a real
Mosquitto: each message is refused with a reason code, logged, counted, and the agent keeps
serving inference and still applies a valid update afterwards."""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from common.protocol.messages import DesiredState
from common.protocol.signing import sign_envelope
from runtimes.examples.variants import mlp_version
from tests.access.metrics import counts
from tests.agent.fleet.conftest import AgentFactory
from tests.agent.fleet.publisher import Fleet
from tests.agent.fleet.test_updates import served
from tests.agent.server import wait_until

LIMIT = 64 * 1024
REJECTED = "edgefleet_fleet_messages_rejected_total"


def _desired(device_id: str, schema_version: int = 1) -> bytes:
    doc = json.loads(
        DesiredState(device_id=device_id, issued_at=datetime.now(UTC)).model_dump_json()
    )
    return json.dumps({**doc, "schema_version": schema_version}).encode()


def _command(fleet: Fleet, device_id: str) -> bytes:
    now = datetime.now(UTC)
    payload = {
        "schema_version": 1,
        "command_id": uuid.uuid4().hex,
        "device_id": device_id,
        "type": "rollback",
        "model": "mlp",
        "reason": "test",
        "issued_at": now.isoformat(),
        "expires_at": (now + timedelta(minutes=5)).isoformat(),
    }
    return json.dumps(fleet.sign(payload)).encode()


def cases(fleet: Fleet) -> list[tuple[str, bytes, str]]:
    """(leaf, payload, expected code) for every kind of bad message on every subscribed topic."""
    noise = random.Random(8).randbytes(700)
    deep = b"[" * 50_000  # json recurses once per level
    oversize = b'{"x": "' + b"a" * LIMIT + b'"}'
    envelope_v2 = sign_envelope(fleet.trust_root(version=2).model_dump(mode="json"), fleet.root_key)
    trust_v2 = json.dumps({**envelope_v2.model_dump(mode="json"), "schema_version": 2}).encode()
    command_v2 = json.loads(_command(fleet, "dev-1"))
    command_v2["schema_version"] = 2
    incomplete_trust = b'{"signed": {"version": 9}, "signatures": [{"key_id": "x", "sig": "y"}]}'
    return [
        ("desired", noise, "malformed"),
        ("desired", oversize, "oversize"),
        ("desired", b'{"hello": "world"}', "malformed"),
        ("desired", b"[1, 2, 3]", "malformed"),
        ("desired", _desired("dev-1", schema_version=2), "unsupported_schema"),
        ("desired", _desired("dev-2"), "wrong_target"),
        ("desired", deep, "malformed"),
        ("commands", noise, "malformed"),
        ("commands", oversize, "oversize"),
        ("commands", b'{"signed": {}, "signatures": []}', "malformed"),
        ("commands", json.dumps(command_v2).encode(), "unsupported_schema"),
        ("commands", _command(fleet, "dev-2"), "wrong_target"),
        ("commands", deep, "malformed"),
        ("trust", noise, "malformed"),
        ("trust", oversize, "oversize"),
        ("trust", incomplete_trust, "malformed"),
        ("trust", trust_v2, "unsupported_schema"),
        ("trust", b'"just a string"', "malformed"),
        ("trust", deep, "malformed"),
    ]


def _topic(fleet: Fleet, leaf: str) -> str:
    return fleet.topics.trust if leaf == "trust" else fleet.topics.device("dev-1", leaf)


@pytest.mark.slow
def test_garbage_on_every_agent_topic_is_refused_counted_and_logged(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Retained garbage waits on the broker for the device before it even starts.
    retained = random.Random(9).randbytes(300)
    fleet.publish_raw(fleet.topics.desired("dev-1"), retained, retain=True)
    fleet.publish_raw(fleet.topics.trust, b"\x00\xff retained", retain=True)
    bad = cases(fleet)
    expected = Counter((leaf, code) for leaf, _, code in bad)
    expected.update([("desired", "malformed"), ("trust", "malformed")])  # the retained two
    with caplog.at_level(logging.INFO), fleet_agent(max_message_bytes=LIMIT) as agent:
        wait_until(lambda: agent.state.fleet.connected.is_set(), what="the broker connection")  # type: ignore[union-attr]
        for leaf, payload, _ in bad:
            fleet.publish_raw(_topic(fleet, leaf), payload)

        def rejected() -> Counter[tuple[str, str]]:
            return counts(agent.client.get("/metrics").text, REJECTED)

        wait_until(lambda: rejected().total() >= expected.total(), what="every rejection")
        assert rejected() == expected
        logged = [r for r in caplog.records if r.getMessage() == "message rejected"]
        assert Counter((r.topic, r.code) for r in logged) == expected  # type: ignore[attr-defined]
        assert all(r.reason for r in logged)  # type: ignore[attr-defined]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "an unexpected error"
        # Still serving, still connected, and a valid update (replacing the retained garbage)
        # is applied as usual.
        assert served(agent)[0] == "1"
        assert agent.state.fleet.connected.is_set()  # type: ignore[union-attr]
        assert agent.state.fleet.trust.version == 1  # type: ignore[union-attr]
        v2 = mlp_version(tmp_path / "v2", seed=99)
        fleet.publish_desired("dev-1", fleet.sign(fleet.manifest("mlp", 2, 1, v2)))
        fleet.wait_event("dev-1", "committed", sequence=1)
        assert served(agent)[0] == "2"
        # every refusal was also reported to the fleet, with its code
        reported = Counter(e.code for e in fleet.events("dev-1") if e.state.value == "rejected")
        assert reported == Counter(code for _, code in expected.elements())


@pytest.mark.slow
def test_a_replayed_command_runs_once(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    """A malicious broker (or a QoS 1 redelivery) hands the same signed rollback over again
    before it expires: the device executes it once, across a restart too."""
    with fleet_agent() as agent:
        for version, seq in ((2, 1), (3, 2)):
            manifest = fleet.manifest(
                "mlp", version, seq, mlp_version(tmp_path / f"v{version}", seed=version)
            )
            fleet.publish_desired("dev-1", fleet.sign(manifest))
            fleet.wait_event("dev-1", "committed", sequence=seq)
        command = _command(fleet, "dev-1")
        fleet.publish_raw(fleet.topics.commands("dev-1"), command)
        assert fleet.wait_event("dev-1", "rolled_back").version == 2
        assert served(agent)[0] == "2"
        fleet.publish_raw(fleet.topics.commands("dev-1"), command)  # the replay
        # a marker behind it on the same topic: once it is refused, the replay was handled
        fleet.publish_raw(fleet.topics.commands("dev-1"), b"marker")
        fleet.wait(
            lambda: [e for e in fleet.events("dev-1") if e.code == "malformed"], what="the marker"
        )
    with fleet_agent(repo=tmp_path / "repo-dev-1") as agent:  # command ids are kept on disk
        fleet.publish_raw(fleet.topics.commands("dev-1"), command)
        fleet.publish_raw(fleet.topics.commands("dev-1"), b"marker")
        fleet.wait(
            lambda: len([e for e in fleet.events("dev-1") if e.code == "malformed"]) == 2,
            what="the marker",
        )
        assert served(agent)[0] == "2"
    states = [
        e.state.value for e in fleet.events("dev-1") if e.state.value in ("rolled_back", "rejected")
    ]
    assert states == ["rolled_back", "rejected", "rejected"]  # one rollback, then the two markers
