"""The test-side fleet: signs manifests with the protocol module, publishes them to a real
broker, and records everything devices publish."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from common.protocol.messages import (
    DesiredState,
    DeviceStatus,
    Telemetry,
    TelemetryAck,
    UpdateEvent,
)
from common.protocol.signing import SigningKey, TrustRoot, sign_envelope
from common.protocol.topics import Topics
from tests.agent.fleet.artifacts import ArtifactServer
from tests.mqtt_broker import stop_paho


def new_trust_root(
    root: SigningKey,
    manifest_keys: list[SigningKey],
    *,
    version: int = 1,
    revoked: list[str] | None = None,
    root_keys: list[SigningKey] | None = None,
) -> TrustRoot:
    return TrustRoot(
        version=version,
        root_keys=[k.public() for k in (root_keys or [root])],
        manifest_keys=[k.public() for k in manifest_keys],
        revoked=revoked or [],
        issued_at=datetime.now(UTC),
    )


@dataclass
class Fleet:
    broker_url: str
    artifacts: ArtifactServer
    root_key: SigningKey = field(default_factory=SigningKey.generate)
    manifest_key: SigningKey = field(default_factory=SigningKey.generate)
    topics: Topics = field(default_factory=Topics)
    received: list[tuple[str, bytes]] = field(default_factory=list)
    acknowledge: bool = True
    """Acknowledge each telemetry message as the control plane does once it stored it."""

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        host, port = self.broker_url.removeprefix("mqtt://").split(":")
        client_id = f"test-fleet-{uuid.uuid4().hex[:8]}"
        self._client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        self._client.on_message = self._on_message
        self._client.on_connect = lambda c, *_: c.subscribe(self.topics.all_devices("#"), qos=1)
        # A persistent session: the broker keeps what devices publish while we reconnect.
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        self._client.reconnect_delay_set(0.05, 0.5)
        self._client.connect(host, int(port), clean_start=False, properties=properties)
        self._client.loop_start()

    def close(self) -> None:
        stop_paho(self._client)

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._cond:
            self.received.append((message.topic, bytes(message.payload)))
            self._cond.notify_all()
        if self.acknowledge and message.topic.endswith("/telemetry"):
            # as the control plane does once it stored them: the device's outbox lets them go
            seq = json.loads(message.payload).get("seq")
            device_id = message.topic.split("/")[-2]
            if isinstance(seq, int) and seq >= 1:
                ack = TelemetryAck(device_id=device_id, seqs=[(seq, seq)])
                client.publish(self.topics.acks(device_id), ack.model_dump_json(), qos=1)

    def wait(
        self, predicate: Callable[[], Any], timeout_s: float = 60, what: str = "a message"
    ) -> Any:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not (result := predicate()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"timed out waiting for {what}; events: {self.events_summary()}"
                    )
                self._cond.wait(remaining)
            return result

    # -- trust and keys -----------------------------------------------------------------

    def trust_root(self, **kwargs: Any) -> TrustRoot:
        return new_trust_root(self.root_key, [self.manifest_key], **kwargs)

    def write_trust_root(self, path: Path) -> Path:
        path.write_text(
            sign_envelope(
                self.trust_root().model_dump(mode="json"), self.root_key
            ).model_dump_json()
        )
        return path

    def publish_trust(self, trust: TrustRoot, *signers: SigningKey) -> None:
        envelope = sign_envelope(trust.model_dump(mode="json"), *(signers or (self.root_key,)))
        self._client.publish(
            self.topics.trust, envelope.model_dump_json(), qos=1, retain=True
        ).wait_for_publish(10)

    # -- manifests ---------------------------------------------------------------------

    def manifest(
        self,
        model: str,
        version: int,
        sequence: int,
        version_dir: Path,
        *,
        fmt: str = "onnx",
        profiles: list[str] | None = None,
        config: dict[str, Any] | None = None,
        health: dict[str, Any] | None = None,
        target: dict[str, Any] | None = None,
        expires_in: timedelta = timedelta(hours=1),
        issued_at: datetime | None = None,
    ) -> dict[str, Any]:
        files, golden = [], None
        for path in sorted(version_dir.iterdir()):
            digest, size, url = self.artifacts.add(path)
            ref = {"name": path.name, "url": url, "sha256": digest, "size": size}
            if path.name == "golden.npz":
                golden = ref
            else:
                files.append(ref)
        issued = issued_at or datetime.now(UTC)
        return {
            "schema_version": 1,
            "model": model,
            "version": version,
            "sequence": sequence,
            "artifacts": [{"format": fmt, "profiles": profiles or [], "files": files}],
            "golden": golden,
            "config": config or {},
            "health": {"window_s": 0.2, "min_requests": 1000, **(health or {})},
            "target": target or {},
            "rollout_id": f"test-{sequence}",
            "issued_at": issued.isoformat(),
            "expires_at": (issued + expires_in).isoformat(),
        }

    def sign(self, payload: dict[str, Any], key: SigningKey | None = None) -> dict[str, Any]:
        return sign_envelope(payload, key or self.manifest_key).model_dump(mode="json")

    def publish_desired(self, device_id: str, *envelopes: dict[str, Any]) -> None:
        desired = DesiredState(
            device_id=device_id, issued_at=datetime.now(UTC), manifests=list(envelopes)
        )
        self.publish_raw(
            self.topics.desired(device_id), desired.model_dump_json().encode(), retain=True
        )

    def publish_raw(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self._client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)

    def command(
        self,
        device_id: str,
        model: str,
        *,
        key: SigningKey | None = None,
        command_id: str | None = None,
        from_version: int | None = None,
    ) -> str:
        """Publish a signed rollback command; return its id (the same id sends it again)."""
        now = datetime.now(UTC)
        command_id = command_id or uuid.uuid4().hex
        payload: dict[str, object] = {
            "schema_version": 1,
            "command_id": command_id,
            "device_id": device_id,
            "type": "rollback",
            "model": model,
            "reason": "operator asked",
            "issued_at": now.isoformat(),
            "expires_at": (now + timedelta(minutes=5)).isoformat(),
        }
        if from_version is not None:
            payload["from_version"] = from_version
        self.publish_raw(
            self.topics.commands(device_id), json.dumps(self.sign(payload, key)).encode()
        )
        return command_id

    # -- what devices said ---------------------------------------------------------------

    def _of(self, device_id: str, leaf: str) -> list[bytes]:
        topic = self.topics.device(device_id, leaf)
        return [p for t, p in self.received if t == topic]

    def events(self, device_id: str) -> list[UpdateEvent]:
        return [UpdateEvent.model_validate_json(p) for p in self._of(device_id, "events")]

    def telemetry(self, device_id: str) -> list[Telemetry]:
        return [Telemetry.model_validate_json(p) for p in self._of(device_id, "telemetry")]

    def statuses(self, device_id: str) -> list[DeviceStatus]:
        return [DeviceStatus.model_validate_json(p) for p in self._of(device_id, "status") if p]

    def events_summary(self) -> list[str]:
        out = []
        for t, p in self.received:
            if t.endswith("/events"):
                e = UpdateEvent.model_validate_json(p)
                out.append(f"{e.model}:{e.sequence}:{e.state.value}:{e.code or ''}")
        return out

    def wait_event(
        self, device_id: str, state: str, *, sequence: int | None = None, timeout_s: float = 60
    ) -> UpdateEvent:
        def find() -> UpdateEvent | None:
            for e in self.events(device_id):
                if e.state.value == state and (sequence is None or e.sequence == sequence):
                    return e
            return None

        return self.wait(find, timeout_s, f"{state} (sequence {sequence}) from {device_id}")  # type: ignore[no-any-return]
