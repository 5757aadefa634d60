"""MQTT 5.0 packets as bytes: the encodings, the parsing of property blocks, the failure reason
codes and :class:`MqttError`, for the control plane's broker connection
(:mod:`control_plane.mqtt.wire`), which owns the socket and the session.

NOTE: sections cited are of the OASIS MQTT Version 5.0 specification (2019).
"""

from __future__ import annotations

CONNECT, CONNACK, PUBLISH, PUBACK = 0x10, 0x20, 0x30, 0x40
SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = 0x82, 0x90, 0xC0, 0xD0, 0xE0
PUBACK_HEAD = bytes([PUBACK, 2])  # PUBACK with reason 0 and no properties (3.4.2.1)
PINGREQ_PACKET = bytes([PINGREQ, 0])
DISCONNECT_PACKET = bytes([DISCONNECT, 0])  # remaining length 0: reason 0x00, normal (3.14.2.1)
MAX_REMAINING = 268_435_455  # four varint bytes (1.5.5)

_REASON_TABLE = """
80 unspecified error; 81 malformed packet; 82 protocol error
83 implementation specific error; 84 unsupported protocol version
85 client identifier not valid; 86 bad user name or password; 87 not authorized
88 server unavailable; 89 server busy; 8A banned; 8B server shutting down
8C bad authentication method; 8D keep alive timeout; 8E session taken over
8F topic filter invalid; 90 topic name invalid; 91 packet identifier in use
93 receive maximum exceeded; 94 topic alias invalid; 95 packet too large
96 message rate too high; 97 quota exceeded; 98 administrative action
99 payload format invalid; 9A retain not supported; 9B QoS not supported
9C use another server; 9D server moved; 9E shared subscriptions not supported
9F connection rate exceeded; A0 maximum connect time
A1 subscription identifiers not supported; A2 wildcard subscriptions not supported
"""
REASONS = {
    int(item[:2], 16): item[3:]
    for item in _REASON_TABLE.replace("\n", "; ").strip("; ").split("; ")
}
"""Failure reason codes (2.4) by value, for error messages."""

# Property identifier -> how its value is encoded (2.2.2.2): 1, 2 or 4 bytes of integer,
# 0 a variable byte integer, -1 a string or binary data, -2 a string pair (user property).
_PROPERTY_TYPES = (
    dict.fromkeys((0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A), 1)
    | dict.fromkeys((0x13, 0x21, 0x22, 0x23), 2)
    | dict.fromkeys((0x02, 0x11, 0x18, 0x27), 4)
    | dict.fromkeys((0x03, 0x08, 0x09, 0x12, 0x15, 0x16, 0x1A, 0x1C, 0x1F), -1)
    | {0x0B: 0, 0x26: -2}
)
SERVER_KEEP_ALIVE, REASON_STRING, RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE = 0x13, 0x1F, 0x21, 0x27
SESSION_TAKEN_OVER = 0x8E
"""DISCONNECT's reason when another client connected with the same client id (3.14.2.1)."""


class MqttError(Exception):
    """The broker refused or dropped us, or answered an operation with a failure reason."""

    code = "mqtt"

    def __init__(self, message: str, reason_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason_code = reason_code


class MalformedPacket(Exception):
    """A protocol violation found while parsing: the connection is closed with this reason."""


def describe(reason_code: int, reason_string: str | None = None) -> str:
    text = f"0x{reason_code:02X} {REASONS.get(reason_code, 'unknown reason')}"
    return f"{text} ({reason_string})" if reason_string else text


def varint(n: int) -> bytes:
    """A variable byte integer (1.5.5)."""
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value, mult = 0, 1
    for _ in range(4):
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) * mult
        if not byte & 0x80:
            return value, pos
        mult *= 128
    raise MalformedPacket("malformed variable byte integer")


def mqtt_string(raw: bytes) -> bytes:
    return len(raw).to_bytes(2, "big") + raw


def properties(data: bytes, pos: int) -> tuple[dict[int, int | bytes], int]:
    """Parse a property block at ``pos``; returns the properties (the last of a repeated one)
    and the position after the block. For the rare packets only: PUBLISH skips its block."""
    length, pos = read_varint(data, pos)
    end = pos + length
    if end > len(data):
        raise MalformedPacket("properties overrun the packet")
    props: dict[int, int | bytes] = {}
    while pos < end:
        ident = data[pos]
        kind = _PROPERTY_TYPES.get(ident)
        pos += 1
        value: int | bytes
        if kind is None:
            raise MalformedPacket(f"unknown property 0x{ident:02X}")
        if kind > 0:
            value = int.from_bytes(data[pos : pos + kind], "big")
            pos += kind
        elif kind == 0:
            value, pos = read_varint(data, pos)
        else:
            for _ in range(-kind):  # a pair is two strings; keep the last
                size = int.from_bytes(data[pos : pos + 2], "big")
                value = data[pos + 2 : pos + 2 + size]
                pos += 2 + size
        props[ident] = value
    if pos != end:
        raise MalformedPacket("properties overrun their length")
    return props, end


def reason_string(props: dict[int, int | bytes]) -> str | None:
    raw = props.get(REASON_STRING)
    return raw.decode(errors="replace") if isinstance(raw, bytes) else None


def connect_packet(
    client_id: str,
    *,
    username: str | None,
    password: str | None,
    keepalive_s: int,
    clean_start: bool,
    session_expiry_s: int,
    receive_maximum: int,
) -> bytes:
    """A CONNECT packet (3.1): no will, no authentication method; properties only where they
    differ from the defaults."""
    flags = (0x02 if clean_start else 0) | (0x80 if username is not None else 0)
    flags |= 0x40 if password is not None else 0
    props = b"\x11" + session_expiry_s.to_bytes(4, "big") if session_expiry_s else b""
    if receive_maximum != 65535:
        props += b"\x21" + receive_maximum.to_bytes(2, "big")
    body = mqtt_string(b"MQTT") + bytes([5, flags]) + keepalive_s.to_bytes(2, "big")
    body += varint(len(props)) + props + mqtt_string(client_id.encode())
    body += mqtt_string(username.encode()) if username is not None else b""
    body += mqtt_string(password.encode()) if password is not None else b""
    return bytes([CONNECT]) + varint(len(body)) + body
