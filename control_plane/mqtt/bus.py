"""The control plane's MQTT connection: ingest what devices publish, publish desired states,
commands and trust roots. Outgoing messages wait here until the broker acknowledges them, so
a broker restart delays them rather than losing them.

It speaks MQTT 5 through :mod:`control_plane.mqtt.wire`, a lean client written for this
connection: every device message of the fleet arrives here, and with paho under aiomqtt the
client library cost more CPU per message than validating and storing it did."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from common.protocol.capture import MAX_ACKED_SAMPLES, CaptureAck
from common.protocol.messages import MAX_ACK_RANGES, DesiredState, TelemetryAck, seq_ranges
from common.protocol.topics import Topics
from control_plane.ingest.ingestor import Ack, Ingestor
from control_plane.mqtt import codec as mqttcodec
from control_plane.mqtt import wire as mqttwire
from control_plane.settings import ControlPlaneSettings

log = logging.getLogger("edgefleet.control_plane.mqtt")
PUBLISH_WINDOW = 100
"""Outgoing QoS 1 messages awaiting their PUBACK at one time (the broker's Receive Maximum
may hold them to fewer)."""
KEEPALIVE_S = 30
RETRY_MIN_S, RETRY_MAX_S = 0.2, 10.0
"""Reconnection delays (doubling, with jitter) after a lost connection or a refusal."""
TAKEOVER_MIN_S, TAKEOVER_MAX_S = 1.0, 60.0
"""Reconnection delays after a session taken over (doubling; back to the minimum after a
session that lasted longer than the maximum)."""
SILENT_TAKEOVER_S = 5.0
"""A session the broker closed without a reason sooner than this may have been taken over
(:func:`takeover_strikes`)."""
TOPIC_CACHE_SIZE = 60_000
"""Device topics whose parse is remembered: three per device for 20,000 devices (about 10 MB);
past that, topics are parsed each time."""


class FleetBus:
    def __init__(self, settings: ControlPlaneSettings, ingestor: Ingestor) -> None:
        self.settings = settings
        self.ingestor = ingestor
        self.topics = Topics(settings.topic_prefix)
        self.connected = asyncio.Event()
        self._retained: OrderedDict[str, bytes] = OrderedDict()
        """Latest payload per retained topic not yet acknowledged (newer replaces older)."""
        self._commands: list[tuple[str, bytes]] = []
        self._stored: dict[str, list[int]] = {}
        """Telemetry seqs stored per device since the last acknowledgements went out."""
        self._acks: list[tuple[str, bytes]] = []
        self._acks_warned = False
        self._wake = asyncio.Event()
        self.published = 0
        self._conn: mqttwire.Connection | None = None
        self.on_broker_state_lost: list[Callable[[], Awaitable[object]]] = []
        """Called when the broker, on a reconnect, kept no session for the control plane: it
        lost its state (restarted without persistence, or replaced), and with it the retained
        desired states and trust root, which these publish again."""
        self._sessions = 0
        self._resyncs: set[asyncio.Task[None]] = set()
        self._topics: dict[str, tuple[str, str]] = {}
        """Device topics parsed already: a dict lookup instead of a split and a regex match
        for every device message."""
        # Reading stops while this many device messages wait for the batch writer, and
        # resumes once a batch brought them under one batch: the broker keeps the rest.
        self.queue_high = 4 * ingestor.batch_size
        self.queue_low = ingestor.batch_size
        ingestor.on_batch_written.append(self._maybe_resume)
        ingestor.on_telemetry_stored.append(self.telemetry_stored)
        ingestor.on_captures_stored.append(self.captures_stored)

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

    def publish_ack(self, device_id: str, payload: bytes) -> None:
        """An acknowledgement to a device (best effort, like the others)."""
        self._acks.append((self.topics.acks(device_id), payload))
        self._wake.set()

    def telemetry_stored(self, stored: list[tuple[str, int]]) -> None:
        """Remember what to acknowledge to each device at the next :meth:`_acknowledge`."""
        pending = self._stored
        for device_id, seq in stored:
            pending.setdefault(device_id, []).append(seq)

    def captures_stored(self, stored: list[tuple[str, list[str]]]) -> None:
        """Acknowledge captured samples at once: the device deletes them from its spool."""
        for device_id, ids in stored:
            for start in range(0, len(ids), MAX_ACKED_SAMPLES):
                ack = CaptureAck(
                    device_id=device_id, sample_ids=ids[start : start + MAX_ACKED_SAMPLES]
                )
                self._acks.append((self.topics.acks(device_id), ack.model_dump_json().encode()))
        self._wake.set()

    def _acknowledge(self) -> None:
        """One :class:`TelemetryAck` per device with news: the seqs stored since the last."""
        stored, self._stored = self._stored, {}
        for device_id, seqs in stored.items():
            ranges = seq_ranges(seqs)
            for start in range(0, len(ranges), MAX_ACK_RANGES):
                ack = TelemetryAck(device_id=device_id, seqs=ranges[start : start + MAX_ACK_RANGES])
                self._acks.append((self.topics.acks(device_id), ack.model_dump_json().encode()))
        if self._acks:
            self._wake.set()

    def _acks_refused(self, conn: mqttwire.Connection, outcomes: Sequence[object]) -> None:
        """Acknowledgements are best effort (a device sends again what is not acknowledged):
        one the broker refuses is dropped, not a reason to end the session. A broker whose ACL
        was written before acknowledgements existed refuses them all (0x87): say so once per
        session, with the fix."""
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if not errors:
            return
        lost = [e for e in errors if not isinstance(e, mqttcodec.MqttError)]
        if lost or conn.closed.done():
            raise (lost or errors)[0]  # the connection, not the acknowledgement
        self.ingestor.metrics.rejected("acks", "refused_by_broker")
        if not self._acks_warned:
            self._acks_warned = True
            log.warning(
                "the broker refuses telemetry acknowledgements: devices will send their "
                "telemetry again until it accepts them; regenerate its ACL (edgefleet fleet "
                "mosquitto-config) so the control plane may write <prefix>/devices/+/acks",
                extra={"error": str(errors[0]), "refused": len(errors)},
            )

    async def _ack_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.telemetry_ack_interval_s)
            self._acknowledge()

    @property
    def backlog(self) -> int:
        return len(self._retained) + len(self._commands) + len(self._acks)

    async def _send(self, conn: mqttwire.Connection) -> None:
        while True:
            self._wake.clear()
            # Up to PUBLISH_WINDOW messages in flight at once: one acknowledgement round trip
            # per message would put a floor of N round trips under a rollout to N devices.
            while self._retained:
                window = list(itertools.islice(self._retained.items(), PUBLISH_WINDOW))
                await asyncio.gather(*(conn.publish(t, p, qos=1, retain=True) for t, p in window))
                for topic, payload in window:
                    if self._retained.get(topic) is payload:  # not replaced meanwhile
                        del self._retained[topic]
                self.published += len(window)
            while self._commands:
                batch = self._commands[:PUBLISH_WINDOW]
                await asyncio.gather(*(conn.publish(t, p, qos=1) for t, p in batch))
                del self._commands[: len(batch)]
                self.published += len(batch)
            while self._acks:
                batch = self._acks[:PUBLISH_WINDOW]
                outcomes = await asyncio.gather(
                    *(conn.publish(t, p, qos=1) for t, p in batch), return_exceptions=True
                )
                del self._acks[: len(batch)]
                self._acks_refused(conn, outcomes)
                self.published += len(batch)
            if not self._retained and not self._commands and not self._acks:
                await self._wake.wait()

    # -- session ----------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._ack_loop(), name="mqtt-acks")
            tg.create_task(self._connection_loop(), name="mqtt-connection")

    async def _connection_loop(self) -> None:
        delay = RETRY_MIN_S
        strikes = 0
        while True:
            began, conn = time.monotonic(), None
            try:
                conn = await self._connect()
                try:
                    await self._session(conn)
                finally:
                    if self.connected.is_set():  # subscribed: a refused SUBSCRIBE backs off
                        delay = RETRY_MIN_S
                    self.connected.clear()
                    self._listening(None)
                    await conn.aclose()
            except (mqttcodec.MqttError, OSError) as exc:
                strikes, taken_over = takeover_strikes(
                    strikes,
                    reason_code=getattr(exc, "reason_code", None),
                    closed_silently=conn is not None
                    and conn.closed_by_peer
                    and conn.disconnect_reason is None,
                    lasted_s=time.monotonic() - began,
                )
                if taken_over:
                    # NOTE: reconnecting at once would take the session back, and the other
                    # client would do the same: back off, doubling, instead of fighting
                    delay = min(TAKEOVER_MAX_S, TAKEOVER_MIN_S * 2 ** (strikes - 1))
                    log.error(
                        "broker session taken over (MQTT reason 0x8E session taken over): "
                        "another client connected with this client id, "
                        f"{self.settings.mqtt_client_id!r}; give each replica its own "
                        "mqtt_client_id, and no other client the control plane's broker login",
                        extra={"takeovers": strikes, "retry_in_s": round(delay, 2)},
                    )
                else:
                    log.warning(
                        "broker connection lost",
                        extra={"error": str(exc), "retry_in_s": round(delay, 2)},
                    )
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(RETRY_MAX_S, delay * 2)

    async def _connect(self) -> mqttwire.Connection:
        s = self.settings
        url = urlsplit(s.mqtt_url)
        tls = url.scheme == "mqtts"
        context = None
        if tls:
            context = ssl.create_default_context(
                cafile=str(s.mqtt_tls_ca_file) if s.mqtt_tls_ca_file else None
            )
            if s.mqtt_tls_cert_file and s.mqtt_tls_key_file:  # mutual TLS
                context.load_cert_chain(str(s.mqtt_tls_cert_file), str(s.mqtt_tls_key_file))
        return await mqttwire.connect(
            url.hostname or "127.0.0.1",
            url.port or (8883 if tls else 1883),
            s.mqtt_client_id,
            self._on_message,
            username=s.mqtt_username,
            password=s.mqtt_password.get_secret_value() if s.mqtt_password else None,
            ssl=context,
            server_hostname=url.hostname,
            keepalive_s=KEEPALIVE_S,
            clean_start=False,
            # a replica's session ends with it: the broker would queue a dead member's share
            session_expiry_s=0 if s.mqtt_shared_group else s.mqtt_session_expiry_s,
            # Device messages are acknowledged once stored, not on receipt (a control plane
            # killed with a batch in memory gets it again): this many may await their
            # acknowledgement at once, and the ingest batch is written when it holds them.
            receive_maximum=s.mqtt_broker_inflight,
            on_reused_id=self.ingestor.metrics.reused_packet_ids.inc,
        )

    async def _session(self, conn: mqttwire.Connection) -> None:
        share = (
            f"$share/{self.settings.mqtt_shared_group}/" if self.settings.mqtt_shared_group else ""
        )
        await conn.subscribe(
            [
                (share + self.topics.all_devices(leaf), 1)
                for leaf in ("status", "telemetry", "events")
            ]
        )
        self._conn = conn
        self.ingestor.metrics.reading_paused.set(0)  # a new connection reads
        self._listening(datetime.now(UTC))
        self.connected.set()
        log.info("connected to the broker", extra={"session_present": conn.session_present})
        self._sessions += 1
        # The first session of this process follows the start-up, which published both.
        if not conn.session_present and self._sessions > 1 and self.on_broker_state_lost:
            log.warning("the broker kept no session: publishing the retained state again")
            task = asyncio.create_task(self._resync(), name="mqtt-resync")
            self._resyncs.add(task)
            task.add_done_callback(self._resyncs.discard)
        sender = asyncio.create_task(self._send(conn), name="mqtt-send")
        try:
            await asyncio.wait([sender, conn.closed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        if sender.done() and not sender.cancelled() and (error := sender.exception()):
            raise error  # a publish failed (MqttError: reconnect) or a bug (not hidden)
        raise mqttcodec.MqttError(conn.close_reason or "connection closed", conn.disconnect_reason)

    async def _resync(self) -> None:
        for callback in self.on_broker_state_lost:
            try:
                await callback()
            except Exception:  # one that fails (the database away) must not stop the others
                log.exception("retained state not published again after a broker reset")

    def _listening(self, since: datetime | None) -> None:
        """Device silence is counted from when the broker session began
        (:mod:`control_plane.ingest.presence`)."""
        self.ingestor.metrics.listening_since = since

    def _maybe_resume(self) -> None:
        conn = self._conn
        if conn is not None and conn.reading_paused and self.ingestor.queued <= self.queue_low:
            conn.resume_reading()
            self.ingestor.metrics.reading_paused.set(0)

    def _on_message(self, topic: str, payload: bytes, ack: Ack | None) -> None:
        """One device message, as the connection reads it (synchronously: what the ingestor
        queues waits for its batch; the broker's Receive Maximum bounds how many, and reading
        pauses past ``queue_high`` whatever the broker does)."""
        ingestor = self.ingestor
        conn = self._conn
        if ingestor.queued >= self.queue_high and conn is not None and not conn.reading_paused:
            conn.pause_reading()
            ingestor.metrics.read_pauses.inc()
            ingestor.metrics.reading_paused.set(1)
        parsed = self._topics.get(topic)
        if parsed is None and (parsed := self.topics.parse(topic)) is not None:
            if len(self._topics) < TOPIC_CACHE_SIZE:
                self._topics[topic] = parsed
        if parsed is None:
            ingestor.reject("unknown", "wrong_topic", topic[:200], "no device topic")
            if ack:
                ack()
            return
        device_id, leaf = parsed
        limit = self.settings.mqtt_max_message_bytes
        if len(payload) > limit:
            ingestor.reject(leaf, "oversize", device_id, f"{len(payload)} bytes exceed {limit}")
            if ack:
                ack()
            return
        try:
            if leaf == "telemetry":
                ingestor.telemetry(device_id, payload, ack)
            elif leaf == "status":
                ingestor.status(device_id, payload, ack)
            elif leaf == "events":
                ingestor.event(device_id, payload, ack)
            elif ack:
                ack()
        except Exception:
            # The last line of defence: one message that trips a bug must not stop ingest
            # for the whole fleet (nor close the connection it came by).
            log.exception("device message not handled", extra={"device_id": device_id})
            ingestor.metrics.rejected(leaf, "internal_error")
            if ack:
                ack()


def takeover_strikes(
    strikes: int, *, reason_code: int | None, closed_silently: bool, lasted_s: float
) -> tuple[int, bool]:
    """Count the sessions in a row that another client took over; return the count and
    whether this one was taken over. ``closed_silently``: the broker closed the connection
    with no DISCONNECT and no error of the socket's.

    A DISCONNECT with reason 0x8E says so. Mosquitto 2.0 (src/handle_connect.c) queues that
    DISCONNECT and closes the socket before writing it, so a session the broker closed with
    no reason within ``SILENT_TAKEOVER_S`` counts too (the other client reconnecting takes it
    again that soon): one alone may be a broker restarting, two in a row are taken as a
    takeover. A broker killed after a longer session starts the count again, as does any
    session that lasted longer than ``TAKEOVER_MAX_S``."""
    taken = reason_code == mqttcodec.SESSION_TAKEN_OVER
    silent = closed_silently and lasted_s < SILENT_TAKEOVER_S
    if lasted_s > TAKEOVER_MAX_S:
        strikes = 0
    strikes = strikes + 1 if taken or silent else 0
    return strikes, taken or strikes >= 2
