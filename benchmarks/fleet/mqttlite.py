"""A lean MQTT 3.1.1 client on a raw asyncio protocol, for the fleet simulator only.

Why not paho/aiomqtt, which the agent uses: measured on this 2-core machine with
``python -m benchmarks.fleet.clientprobe`` (one process, one client per device, 5 QoS 1
publishes each), aiomqtt managed 7,000 publishes/s at 1,000 devices and 3,800/s at 3,000
(0.13-0.24 ms of CPU per publish, and 6 % of a core idle for 3,000 connected devices); this
client managed 25,000/s and 19,000/s (0.03 ms per publish, nothing idle). The simulator must
publish many times faster than the control plane ingests, so it speaks the wire format
itself: one ``asyncio.Protocol`` per connection, no task per device, PUBACKs matched to
futures only where the caller waits for them.

Only what a device needs: CONNECT (with a will), SUBSCRIBE, PUBLISH QoS 0/1 both ways,
PUBACK, PINGREQ, DISCONNECT. See the MQTT 3.1.1 specification (OASIS, 2014), section 3.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import cast

from control_plane.mqtt.codec import varint  # the remaining length's encoding is MQTT 3's too

CONNECT, CONNACK, PUBLISH, PUBACK = 0x10, 0x20, 0x30, 0x40
SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = 0x82, 0x90, 0xC0, 0xD0, 0xE0

OnMessage = Callable[[str, bytes], None]


class MqttLiteError(Exception):
    """The broker refused us or the connection broke."""


def _str(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(raw)) + raw


def publish_packet(topic: str, payload: bytes, qos: int, retain: bool, packet_id: int) -> bytes:
    head = PUBLISH | (qos << 1) | int(retain)
    body = _str(topic) + (struct.pack("!H", packet_id) if qos else b"") + payload
    return bytes([head]) + varint(len(body)) + body


class MqttLite(asyncio.Protocol):
    """One connection. ``on_message`` is called for every PUBLISH received (QoS 1 acknowledged
    first, as paho does)."""

    def __init__(self, on_message: OnMessage | None = None) -> None:
        self.on_message = on_message
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._connack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.received = 0
        self.acked = 0

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not subclasses of asyncio.Transport, only alike)
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        err = MqttLiteError(f"connection lost: {exc}")
        for fut in [self._connack, *self._waiting.values()]:
            if not fut.done():
                fut.set_exception(err)
        self._waiting.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 2:
            # remaining length: up to 4 bytes after the fixed header byte
            mult, length, i = 1, 0, pos + 1
            while True:
                if i >= end:
                    del buf[:pos]
                    return
                byte = buf[i]
                length += (byte & 0x7F) * mult
                mult *= 128
                i += 1
                if not byte & 0x80:
                    break
            if end - i < length:
                break
            self._packet(buf[pos], bytes(buf[i : i + length]))
            pos = i + length
        del buf[:pos]

    def _packet(self, head: int, body: bytes) -> None:
        kind = head & 0xF0
        if kind == PUBLISH:
            qos = (head >> 1) & 3
            (tlen,) = struct.unpack_from("!H", body)
            topic = body[2 : 2 + tlen].decode()
            start = 2 + tlen
            if qos:
                assert self.transport is not None
                self.transport.write(bytes([PUBACK, 2]) + body[start : start + 2])
                start += 2
            self.received += 1
            if self.on_message is not None:
                self.on_message(topic, body[start:])
        elif kind in (PUBACK, SUBACK):
            (packet_id,) = struct.unpack_from("!H", body)
            self.acked += kind == PUBACK
            fut = self._waiting.pop(packet_id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif kind == CONNACK:
            if body[1] != 0:
                self._connack.set_exception(MqttLiteError(f"CONNACK return code {body[1]}"))
            elif not self._connack.done():
                self._connack.set_result(None)

    # -- client operations -----------------------------------------------------------------

    def _packet_id(self) -> int:
        self._next_id = self._next_id % 65535 + 1
        return self._next_id

    def _write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise MqttLiteError("not connected")
        self.transport.write(data)

    async def handshake(
        self,
        client_id: str,
        *,
        keepalive_s: int = 60,
        clean_session: bool = True,
        will: tuple[str, bytes, int, bool] | None = None,
        login: tuple[str, str] | None = None,
    ) -> None:
        flags = 0x02 if clean_session else 0
        payload = _str(client_id)
        if will is not None:
            topic, message, qos, retain = will
            flags |= 0x04 | (qos << 3) | (0x20 if retain else 0)
            payload += _str(topic) + _str(message)
        if login is not None:  # (username, password): devices enrolled by claim log in
            flags |= 0xC0
            payload += _str(login[0]) + _str(login[1])
        body = _str("MQTT") + bytes([4, flags]) + struct.pack("!H", keepalive_s) + payload
        self._write(bytes([CONNECT]) + varint(len(body)) + body)
        await self._connack

    async def subscribe(self, filters: list[tuple[str, int]]) -> None:
        packet_id = self._packet_id()
        body = struct.pack("!H", packet_id) + b"".join(_str(t) + bytes([q]) for t, q in filters)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[packet_id] = fut
        self._write(bytes([SUBSCRIBE]) + varint(len(body)) + body)
        await fut

    def publish(
        self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, wait: bool = False
    ) -> asyncio.Future[None] | None:
        """Send now. With ``wait`` (QoS 1), return a future the PUBACK resolves; otherwise the
        PUBACK only counts in ``acked``."""
        packet_id = self._packet_id() if qos else 0
        fut = None
        if qos and wait:
            fut = asyncio.get_running_loop().create_future()
            self._waiting[packet_id] = fut
        self._write(publish_packet(topic, payload, qos, retain, packet_id))
        return fut

    def ping(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(bytes([PINGREQ, 0]))

    def disconnect(self) -> None:
        """A clean goodbye: the broker discards the will."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(bytes([DISCONNECT, 0]))
            self.transport.close()

    @property
    def write_buffer_bytes(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0


async def connect(
    host: str,
    port: int,
    client_id: str,
    on_message: OnMessage | None = None,
    *,
    keepalive_s: int = 60,
    clean_session: bool = True,
    will: tuple[str, bytes, int, bool] | None = None,
    timeout_s: float = 30.0,
    login: tuple[str, str] | None = None,
) -> MqttLite:
    loop = asyncio.get_running_loop()
    _, proto = await asyncio.wait_for(
        loop.create_connection(lambda: MqttLite(on_message), host, port), timeout_s
    )
    handshake = proto.handshake(
        client_id, keepalive_s=keepalive_s, clean_session=clean_session, will=will, login=login
    )
    try:
        await asyncio.wait_for(handshake, timeout_s)
    except BaseException:  # no CONNACK: the connection goes, not left to be answered later
        if proto.transport is not None:
            proto.transport.abort()
        raise
    return proto
