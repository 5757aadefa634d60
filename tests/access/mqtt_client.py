"""A plain MQTT 5 client for access tests (paho, its own network thread): connect with a
username and password or a certificate, and see what the broker answers to each packet
(CONNACK, PUBACK and SUBACK reason codes) and which messages reach it."""

from __future__ import annotations

import ssl
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode

from tests.mqtt_broker import stop_paho

NOT_AUTHORIZED = 0x87


class ProbeClient:
    def __init__(
        self,
        port: int,
        *,
        username: str | None = None,
        password: str | None = None,
        client_id: str | None = None,
        ca: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
    ) -> None:
        self.port = port
        self._cond = threading.Condition()
        self.connack: ReasonCode | None = None
        self.disconnected = False
        self.pubacks: dict[int, ReasonCode] = {}
        self.subacks: dict[int, list[ReasonCode]] = {}
        self.received: list[tuple[str, bytes, bool]] = []
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id or f"probe-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        if username is not None:
            self.client.username_pw_set(username, password)
        if ca is not None:
            context = ssl.create_default_context(cafile=str(ca))
            if cert is not None and key is not None:
                context.load_cert_chain(str(cert), str(key))
            self.client.tls_set_context(context)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message

    # -- callbacks (paho's network thread) ---------------------------------------------

    def _on_connect(
        self, client: Any, userdata: Any, flags: Any, rc: ReasonCode, props: Any
    ) -> None:
        with self._cond:
            self.connack = rc
            self._cond.notify_all()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        with self._cond:
            self.disconnected = True
            self._cond.notify_all()

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: ReasonCode, props: Any) -> None:
        with self._cond:
            self.pubacks[mid] = rc
            self._cond.notify_all()

    def _on_subscribe(
        self, client: Any, userdata: Any, mid: int, rcs: list[ReasonCode], props: Any
    ) -> None:
        with self._cond:
            self.subacks[mid] = rcs
            self._cond.notify_all()

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._cond:
            self.received.append((message.topic, bytes(message.payload), bool(message.retain)))
            self._cond.notify_all()

    # -- actions -----------------------------------------------------------------------

    def wait(self, predicate: Callable[[], Any], what: str, timeout_s: float = 30) -> Any:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not (result := predicate()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"timed out waiting for {what}")
                self._cond.wait(remaining)
            return result

    def connect(self) -> ReasonCode | None:
        """Connect and return the CONNACK reason code, or None when the broker (or the TLS
        handshake) closed the connection without one."""
        try:
            self.client.connect("127.0.0.1", self.port, keepalive=30)
        except (ssl.SSLError, OSError):
            return None  # refused in the TLS handshake
        self.client.loop_start()
        self.wait(lambda: self.connack is not None or self.disconnected, "a CONNACK")
        return self.connack

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> ReasonCode:
        """Publish at QoS 1 and return the PUBACK's reason code."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        return self.wait(lambda: self.pubacks.get(info.mid), f"the PUBACK of {topic}")  # type: ignore[no-any-return]

    def subscribe(self, topic: str) -> list[ReasonCode]:
        """Subscribe at QoS 1 and return the SUBACK's reason codes."""
        _, mid = self.client.subscribe(topic, qos=1)
        return self.wait(lambda: self.subacks.get(mid), f"the SUBACK of {topic}")  # type: ignore[no-any-return]

    def messages(self, topic: str) -> list[bytes]:
        with self._cond:
            return [p for t, p, _ in self.received if t == topic]

    def close(self) -> None:
        stop_paho(self.client)
