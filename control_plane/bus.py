"""The control plane's MQTT connection: ingest what devices publish, publish desired states,
commands and trust roots. Outgoing messages wait here until the broker acknowledges them, so
a broker restart delays them rather than losing them."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import ssl
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.protocol.messages import DesiredState
from agent.protocol.topics import Topics
from control_plane.ingest import Ingestor
from control_plane.settings import ControlPlaneSettings

log = logging.getLogger("edgefleet.control_plane.mqtt")
PUBLISH_WINDOW = 100
"""Outgoing QoS 1 messages awaiting their PUBACK at one time."""


class FleetBus:
    def __init__(self, settings: ControlPlaneSettings, ingestor: Ingestor) -> None:
        self.settings = settings
        self.ingestor = ingestor
        self.topics = Topics(settings.topic_prefix)
        self.connected = asyncio.Event()
        self._retained: OrderedDict[str, bytes] = OrderedDict()
        """Latest payload per retained topic not yet acknowledged (newer replaces older)."""
        self._commands: list[tuple[str, bytes]] = []
        self._wake = asyncio.Event()
        self.published = 0
        self._connection = 0
        """Counts connections: an acknowledgement is sent on the connection its message came
        by (after a reconnect the broker delivers unacknowledged messages again)."""

    # -- outgoing ---------------------------------------------------------------------------

    def publish_desired(self, device_id: str, manifests: list[dict[str, Any]]) -> None:
        desired = DesiredState(
            device_id=device_id, issued_at=datetime.now(UTC), manifests=manifests
        )
        self.publish_retained(self.topics.desired(device_id), desired.model_dump_json().encode())

    def publish_retained(self, topic: str, payload: bytes) -> None:
        self._retained.pop(topic, None)
        self._retained[topic] = payload
        self._wake.set()

    def publish_command(self, device_id: str, envelope: dict[str, Any]) -> None:
        self._commands.append((self.topics.commands(device_id), json.dumps(envelope).encode()))
        self._wake.set()

    @property
    def backlog(self) -> int:
        return len(self._retained) + len(self._commands)

    async def _send(self, client: aiomqtt.Client) -> None:
        while True:
            self._wake.clear()
            # Up to PUBLISH_WINDOW messages in flight at once: one acknowledgement round trip
            # per message would put a floor of N round trips under a rollout to N devices.
            while self._retained:
                window = list(itertools.islice(self._retained.items(), PUBLISH_WINDOW))
                await asyncio.gather(
                    *(client.publish(t, p, qos=1, retain=True, timeout=10) for t, p in window)
                )
                for topic, payload in window:
                    if self._retained.get(topic) is payload:  # not replaced meanwhile
                        del self._retained[topic]
                self.published += len(window)
            while self._commands:
                batch = self._commands[:PUBLISH_WINDOW]
                await asyncio.gather(*(client.publish(t, p, qos=1, timeout=10) for t, p in batch))
                del self._commands[: len(batch)]
                self.published += len(batch)
            if not self._retained and not self._commands:
                await self._wake.wait()

    # -- session ----------------------------------------------------------------------------

    async def run(self) -> None:
        delay = 0.2
        while True:
            try:
                async with self._client() as client:
                    delay = 0.2
                    await self._session(client)
            except aiomqtt.MqttError as exc:
                log.warning(
                    "broker connection lost",
                    extra={"error": str(exc), "retry_in_s": round(delay, 2)},
                )
            finally:
                self.connected.clear()
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(10.0, delay * 2)

    def _client(self) -> aiomqtt.Client:
        s = self.settings
        from urllib.parse import urlsplit

        url = urlsplit(s.mqtt_url)
        tls = url.scheme == "mqtts"
        context = None
        if tls:
            context = ssl.create_default_context(
                cafile=str(s.mqtt_tls_ca_file) if s.mqtt_tls_ca_file else None
            )
            if s.mqtt_tls_cert_file and s.mqtt_tls_key_file:  # mutual TLS
                context.load_cert_chain(str(s.mqtt_tls_cert_file), str(s.mqtt_tls_key_file))
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = s.mqtt_session_expiry_s
        client = aiomqtt.Client(
            url.hostname or "127.0.0.1",
            url.port or (8883 if tls else 1883),
            username=s.mqtt_username,
            password=s.mqtt_password.get_secret_value() if s.mqtt_password else None,
            identifier=s.mqtt_client_id,
            protocol=aiomqtt.ProtocolVersion.V5,
            tls_context=context,
            timeout=10,
            keepalive=30,
            clean_start=False,
            properties=properties,
            max_queued_incoming_messages=200_000,
        )
        # a full publish window is the plan, not a symptom: warn only beyond it
        client.pending_calls_threshold = PUBLISH_WINDOW + 10
        # Device messages are acknowledged once stored, not on receipt: a control plane killed
        # with a batch in memory gets it again from the broker. (aiomqtt has no option for it;
        # paho's manual_ack is set on the client it wraps.)
        client._client.manual_ack_set(True)
        return client

    async def _session(self, client: aiomqtt.Client) -> None:
        self._connection += 1
        share = (
            f"$share/{self.settings.mqtt_shared_group}/" if self.settings.mqtt_shared_group else ""
        )
        await client.subscribe(
            [
                (share + self.topics.all_devices(leaf), 1)
                for leaf in ("status", "telemetry", "events")
            ]
        )
        self.connected.set()
        log.info("connected to the broker")
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._receive(client))
                tg.create_task(self._send(client))
        except ExceptionGroup as group:
            lost = [e for e in group.exceptions if isinstance(e, aiomqtt.MqttError)]
            if lost:
                raise lost[0] from None
            raise

    def _acker(self, client: aiomqtt.Client, message: aiomqtt.Message) -> Callable[[], None] | None:
        if message.qos == 0:
            return None
        paho, connection, mid, qos = client._client, self._connection, message.mid, message.qos

        def ack() -> None:
            if connection == self._connection and self.connected.is_set():
                paho.ack(mid, qos)

        return ack

    async def _receive(self, client: aiomqtt.Client) -> None:
        limit = self.settings.mqtt_max_message_bytes
        ingestor = self.ingestor
        async for message in client.messages:
            ack = self._acker(client, message)
            parsed = self.topics.parse(message.topic.value)
            payload = message.payload if isinstance(message.payload, bytes) else b""
            if parsed is None:
                ingestor.reject(
                    "unknown", "wrong_topic", message.topic.value[:200], "no device topic"
                )
                if ack:
                    ack()
                continue
            device_id, leaf = parsed
            if len(payload) > limit:
                ingestor.reject(leaf, "oversize", device_id, f"{len(payload)} bytes exceed {limit}")
                if ack:
                    ack()
                continue
            try:
                if leaf == "status":
                    await ingestor.status(device_id, payload, ack)
                elif leaf == "telemetry":
                    await ingestor.telemetry(device_id, payload, ack)
                elif leaf == "events":
                    await ingestor.event(device_id, payload, ack)
                elif ack:
                    ack()
            except Exception:
                # The last line of defence: one message that trips a bug (or a database
                # refusal of one presence update) must not stop ingest for the whole fleet.
                log.exception("device message not handled", extra={"device_id": device_id})
                ingestor.metrics.rejected(leaf, "internal_error")
