"""The control plane's lean MQTT 5 client against a real Mosquitto (paho as the other side
where a second, independent client is the point), and its framing fed bytes directly."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import signal
import ssl
import subprocess
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from control_plane.mqtt.codec import MqttError
from control_plane.mqtt.wire import Ack, Connection, connect
from tests.agent.server import wait_until
from tests.mqtt_broker import Mosquitto, stop_paho
from tests.tls import TestCA

T = TypeVar("T")
HOST = "127.0.0.1"


def run(coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout_s):
            return await coro

    return asyncio.run(bounded())


class Inbox:
    """An ``on_message`` that keeps what arrives and acknowledges it (or what ``ack`` picks)."""

    def __init__(self, *, ack: bool | Callable[[bytes], bool] = True) -> None:
        self.auto_ack = ack
        self.messages: list[tuple[str, bytes]] = []
        self.acks: list[Ack | None] = []
        self._changed = asyncio.Event()

    def __call__(self, topic: str, payload: bytes, ack: Ack | None) -> None:
        self.messages.append((topic, payload))
        self.acks.append(ack)
        if ack is not None and (
            self.auto_ack is True or (self.auto_ack and self.auto_ack(payload))
        ):
            ack()
        self._changed.set()

    @property
    def payloads(self) -> list[bytes]:
        return [payload for _, payload in self.messages]

    async def until(self, count: int, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.messages) < count:
                self._changed.clear()
                await self._changed.wait()


async def close_and_wait(conn: Connection) -> None:
    conn.close()
    await asyncio.wait_for(conn.closed, 5)


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    # max_inflight_messages is what Mosquitto sends as Receive Maximum in CONNACK; no cap on
    # the queue of a slow subscriber; a packet size limit for the client to honour
    config = (
        "allow_anonymous true\nmax_inflight_messages 5\nmax_queued_messages 0\n"
        "max_packet_size 100000\n"
    )
    broker = Mosquitto(tmp_path_factory.mktemp("mqttwire"), extra_config=config).start()
    yield broker
    broker.stop()


@pytest.fixture
def paho_client(mosquitto: Mosquitto) -> Iterator[paho.Client]:
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.connect(HOST, mosquitto.port)
    client.loop_start()
    wait_until(client.is_connected, 10, "paho connected")
    yield client
    stop_paho(client)


def test_unacknowledged_messages_come_again_on_the_next_connection(
    mosquitto: Mosquitto, paho_client: paho.Client
) -> None:
    session: dict[str, Any] = {"session_expiry_s": 60, "timeout_s": 5.0}

    async def subscribe() -> bool:
        conn = await connect(
            HOST, mosquitto.port, "cp-redeliver", Inbox(), clean_start=True, **session
        )
        await conn.subscribe([("redeliver/#", 1)])
        await close_and_wait(conn)
        return conn.session_present

    assert run(subscribe()) is False
    # published while we are away, with properties the broker passes on (skipped by us)
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = [("origin", "test")]
    props.MessageExpiryInterval = 600
    props.ContentType = "text/plain"
    for i in range(10):
        info = paho_client.publish(f"redeliver/{i}", b"%d" % i, qos=1, properties=props)
        info.wait_for_publish(5)

    async def receive(ack_even: bool) -> tuple[Inbox, bool]:
        # Mosquitto sends at most 5 unacknowledged (max_inflight_messages): acknowledging the
        # even ones as they come lets all ten through
        inbox = Inbox(ack=lambda payload: ack_even and int(payload) % 2 == 0)
        conn = await connect(HOST, mosquitto.port, "cp-redeliver", inbox, **session)
        await inbox.until(10 if ack_even else 5)
        await close_and_wait(conn)
        for ack in inbox.acks:  # after the connection: nothing, no error
            assert ack is not None
            ack()
        return inbox, conn.session_present

    first, present = run(receive(ack_even=True))
    assert present is True
    assert first.messages == [(f"redeliver/{i}", b"%d" % i) for i in range(10)]
    again, present = run(receive(ack_even=False))
    assert present is True
    assert again.payloads == [b"1", b"3", b"5", b"7", b"9"]

    async def drain(marker: bytes, count: int) -> list[bytes]:
        inbox = Inbox()  # acknowledges everything
        conn = await connect(HOST, mosquitto.port, "cp-redeliver", inbox, **session)
        await conn.publish("redeliver/end", marker)  # comes after what the session held
        await inbox.until(count)
        await close_and_wait(conn)
        return inbox.payloads

    assert run(drain(b"end", 6)) == [b"1", b"3", b"5", b"7", b"9", b"end"]
    assert run(drain(b"end again", 1)) == [b"end again"]


@pytest.mark.slow
def test_many_messages_arrive_in_order_through_a_small_receive_maximum(
    mosquitto: Mosquitto,
) -> None:
    count = 5000

    async def scenario() -> tuple[Inbox, int]:
        # acknowledged as they come: the broker sends 3 at a time (our Receive Maximum, below
        # its own max_inflight_messages of 5), so all arrive only if the acknowledgements do
        inbox = Inbox()
        sub = await connect(
            HOST, mosquitto.port, "cp-many", inbox, clean_start=True, receive_maximum=3
        )
        await sub.subscribe([("many/#", 1)])
        pub = await connect(HOST, mosquitto.port, "pub-many", Inbox(), clean_start=True)
        # each publish's timeout covers its wait for a slot: the last of 5,000 waits longest
        sends = (pub.publish("many/x", b"%d" % i, timeout_s=60) for i in range(count))
        await asyncio.gather(*sends)
        await inbox.until(count, timeout_s=30)
        await close_and_wait(pub)
        await close_and_wait(sub)
        return inbox, sub.received

    inbox, received = run(scenario())
    assert inbox.payloads == [b"%d" % i for i in range(count)]
    assert received == count


def test_publishes_reach_a_paho_subscriber_and_retained_ones_a_later_subscriber(
    mosquitto: Mosquitto, paho_client: paho.Client
) -> None:
    got: list[tuple[str, bytes, bool]] = []
    paho_client.on_message = lambda _c, _u, m: got.append(
        (m.topic, bytes(m.payload), bool(m.retain))
    )
    subscribed = threading.Event()
    paho_client.on_subscribe = lambda *_: subscribed.set()
    paho_client.subscribe("pub/#", qos=1)
    wait_until(subscribed.is_set, 10, "paho subscribed")
    count = 200

    async def scenario() -> tuple[int, Inbox]:
        conn = await connect(HOST, mosquitto.port, "cp-pub", Inbox(), clean_start=True)
        # far more at once than the broker's Receive Maximum: the rest wait for a slot
        await asyncio.gather(*(conn.publish(f"pub/{i}", b"m%d" % i) for i in range(count)))
        await conn.publish("pub/retained", b"kept", retain=True)
        await conn.publish("pub/q0", b"at most once", qos=0)
        with pytest.raises(MqttError, match="exceeds 100000"):
            await conn.publish("pub/big", b"x" * 100_001)
        await close_and_wait(conn)
        later = Inbox()
        conn = await connect(HOST, mosquitto.port, "cp-later", later, clean_start=True)
        await conn.subscribe([("pub/retained", 1)])
        await later.until(1)
        await close_and_wait(conn)
        return conn.broker_receive_maximum, later

    receive_maximum, later = run(scenario())
    assert receive_maximum == 5
    assert later.messages == [("pub/retained", b"kept")]
    wait_until(lambda: len(got) == count + 2, 10, "paho received")
    assert got[:count] == [(f"pub/{i}", b"m%d" % i, False) for i in range(count)]
    assert got[count:] == [("pub/retained", b"kept", False), ("pub/q0", b"at most once", False)]


def test_a_disconnect_from_the_broker_is_kept_as_the_close_reason(mosquitto: Mosquitto) -> None:
    async def scenario() -> str | None:
        conn = await connect(HOST, mosquitto.port, "cp-wildcard", Inbox(), clean_start=True)
        # no topic checks here: the broker's DISCONNECT tells what was wrong
        with pytest.raises(MqttError, match="DISCONNECT 0x82 protocol error"):
            await conn.publish("a/#", b"a wildcard in a topic name")
        await asyncio.wait_for(conn.closed, 5)
        with pytest.raises(MqttError, match="not connected: broker sent DISCONNECT 0x82"):
            await conn.publish("a/b", b"late")
        conn.close()  # closing what has ended does nothing
        return conn.close_reason

    assert run(scenario()) == "broker sent DISCONNECT 0x82 protocol error"


def test_connect_and_connack_on_the_wire() -> None:
    """The CONNECT we send and the CONNACK properties we honour, against a scripted peer."""
    connack_props = (
        b"\x21\x00\x07"  # Receive Maximum 7
        b"\x27\x00\x00\x01\x2c"  # Maximum Packet Size 300
        b"\x13\x00\x05"  # Server Keep Alive 5
        b"\x26\x00\x01k\x00\x01v"  # a user property, skipped
    )

    async def scenario() -> tuple[bytes, Connection]:
        connect_packet: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readexactly(2)  # short enough for a one-byte length
            connect_packet.set_result(head + await reader.readexactly(head[1]))
            props = connack_props
            writer.write(bytes([0x20, 3 + len(props), 0x01, 0x00, len(props)]) + props)
            assert await reader.readexactly(2) == b"\xe0\x00"  # DISCONNECT, then we close
            writer.close()

        server = await asyncio.start_server(peer, HOST, 0)
        port = server.sockets[0].getsockname()[1]
        options: dict[str, Any] = {"keepalive_s": 20, "session_expiry_s": 3600}
        conn = await connect(
            HOST,
            port,
            "cp-wire",
            Inbox(),
            username="u",
            password="p",
            receive_maximum=42,
            **options,
        )
        with pytest.raises(MqttError, match="PUBLISH of 311 bytes to 'a/b' exceeds 300"):
            await conn.publish("a/b", b"x" * 300)
        await close_and_wait(conn)
        server.close()
        await server.wait_closed()
        return connect_packet.result(), conn

    packet, conn = run(scenario())
    body = (
        b"\x00\x04MQTT\x05\xc0\x00\x14"  # MQTT 5, user name and password flags, keep alive 20
        b"\x08\x11\x00\x00\x0e\x10\x21\x00\x2a"  # Session Expiry 3600, Receive Maximum 42
        b"\x00\x07cp-wire\x00\x01u\x00\x01p"
    )
    assert packet == bytes([0x10, len(body)]) + body
    assert conn.session_present
    assert (conn.broker_receive_maximum, conn.max_packet_size, conn.keepalive_s) == (7, 300, 5)


# -- authentication and authorisation --------------------------------------------------------


def test_user_name_and_password(tmp_path: Path) -> None:
    passwords, acl = tmp_path / "passwords", tmp_path / "acl"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwords), "cp", "s3cret"], check=True)
    acl.write_text("user cp\ntopic readwrite allowed/#\n")
    config = f"allow_anonymous false\npassword_file {passwords}\nacl_file {acl}\n"
    broker = Mosquitto(tmp_path / "broker", extra_config=config).start()

    async def scenario() -> None:
        conn = await connect(
            HOST, broker.port, "cp-auth", Inbox(), username="cp", password="s3cret"
        )
        await conn.publish("allowed/x", b"ok")
        # acl_file filters publishes (PUBACK 0x87); Mosquitto 2.0 grants any subscription
        with pytest.raises(MqttError, match="PUBACK 0x87 not authorized") as denied:
            await conn.publish("other/x", b"no")
        assert denied.value.reason_code == 0x87
        await close_and_wait(conn)
        for password in ("wrong", None):
            with pytest.raises(MqttError, match="refused: 0x87 not authorized") as refused:
                await connect(
                    HOST, broker.port, "cp-auth", Inbox(), username="cp", password=password
                )
            assert refused.value.reason_code == 0x87
            assert "wrong" not in str(refused.value)

    try:
        run(scenario())
    finally:
        broker.stop()


def test_a_subscription_the_acl_refuses_raises(tmp_path: Path) -> None:
    # Mosquitto 2.0's acl_file never refuses a subscription; its dynamic security plugin does
    salt = b"0123456789ab"
    digest = hashlib.pbkdf2_hmac("sha512", b"s3cret", salt, 101, 64)
    b64 = base64.b64encode
    dynsec = {
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": True,
            "subscribe": False,
            "unsubscribe": True,
        },
        "clients": [
            {
                "username": "cp",
                "password": b64(digest).decode(),
                "salt": b64(salt).decode(),
                "iterations": 101,
                "roles": [{"rolename": "cp"}],
            }
        ],
        "groups": [],
        "roles": [
            {
                "rolename": "cp",
                "acls": [{"acltype": "subscribePattern", "topic": "allowed/#", "allow": True}],
            }
        ],
    }
    (tmp_path / "dynsec.json").write_text(json.dumps(dynsec))
    config = (
        "allow_anonymous false\nplugin /usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so\n"
        f"plugin_opt_config_file {tmp_path / 'dynsec.json'}\n"
    )
    broker = Mosquitto(tmp_path / "broker", extra_config=config).start()

    async def scenario() -> None:
        conn = await connect(HOST, broker.port, "cp-acl", Inbox(), username="cp", password="s3cret")
        await conn.subscribe([("allowed/#", 1)])
        with pytest.raises(MqttError, match="'denied/#' refused: 0x87 not authorized") as refused:
            await conn.subscribe([("allowed/a", 1), ("denied/#", 1)])
        assert refused.value.reason_code == 0x87
        await conn.subscribe([("allowed/b", 0)])  # the connection is still good
        await close_and_wait(conn)

    try:
        run(scenario())
    finally:
        broker.stop()


def test_tls(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    server = ca.issue("broker", server=True)
    config = (
        f"cafile {ca.cert_path}\ncertfile {server.cert}\nkeyfile {server.key}\n"
        "allow_anonymous true\n"
    )
    broker = Mosquitto(tmp_path / "broker", extra_config=config).start()
    context = ssl.create_default_context(cafile=str(ca.cert_path))

    async def scenario() -> Inbox:
        inbox = Inbox()
        conn = await connect(
            HOST, broker.port, "cp-tls", inbox, ssl=context, server_hostname="localhost"
        )
        await conn.subscribe([("tls/#", 1)])
        await conn.publish("tls/x", b"private")
        await inbox.until(1)
        await close_and_wait(conn)
        with pytest.raises(MqttError, match="failed"):  # a context without our CA
            await connect(HOST, broker.port, "cp-plain", Inbox(), ssl=ssl.create_default_context())
        return inbox

    try:
        assert run(scenario()).messages == [("tls/x", b"private")]
    finally:
        broker.stop()


# -- keep alive and a broker that goes away --------------------------------------------------


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path / "broker").start()
    yield broker
    broker.stop(kill=True)


def _freeze(broker: Mosquitto) -> None:
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGSTOP)  # the TCP connection stays up; nothing answers


@pytest.mark.slow
def test_pings_keep_an_idle_connection_up(own_broker: Mosquitto) -> None:
    async def scenario() -> tuple[Inbox, Connection]:
        inbox = Inbox()
        conn = await connect(HOST, own_broker.port, "cp-idle", inbox, keepalive_s=1)
        await conn.subscribe([("idle/#", 1)])
        await asyncio.sleep(3)  # the idle time is the test: Mosquitto drops us after 1.5 s
        assert not conn.closed.done()
        await conn.publish("idle/x", b"still here")
        await inbox.until(1)
        await close_and_wait(conn)
        return inbox, conn

    inbox, conn = run(scenario())
    assert conn.close_reason is None
    assert inbox.payloads == [b"still here"]


@pytest.mark.slow
def test_paused_reading_holds_messages_in_the_broker_and_outlives_the_keep_alive(
    own_broker: Mosquitto,
) -> None:
    async def scenario() -> tuple[Inbox, Connection, int, int]:
        inbox = Inbox()
        sub = await connect(HOST, own_broker.port, "cp-pause", inbox, keepalive_s=1)
        await sub.subscribe([("pause/#", 1)])
        sub.pause_reading()
        pub = await connect(HOST, own_broker.port, "pub-pause", Inbox(), clean_start=True)
        await asyncio.gather(*(pub.publish("pause/x", b"%d" % i) for i in range(200)))
        # paused past twice the keep alive: the connection stays, nothing is read meanwhile
        await asyncio.sleep(3)
        while_paused = len(inbox.messages)
        still_open = int(not sub.closed.done())
        sub.resume_reading()
        await inbox.until(200)
        await close_and_wait(pub)
        await close_and_wait(sub)
        return inbox, sub, while_paused, still_open

    inbox, sub, while_paused, still_open = run(scenario())
    assert while_paused == 0 and still_open == 1
    assert inbox.payloads == [b"%d" % i for i in range(200)]
    assert sub.close_reason is None


@pytest.mark.slow
def test_a_silent_broker_is_given_up_on(own_broker: Mosquitto) -> None:
    async def scenario() -> Connection:
        conn = await connect(HOST, own_broker.port, "cp-silent", Inbox(), keepalive_s=1)
        _freeze(own_broker)
        pending = asyncio.create_task(conn.publish("silent/x", b"lost", timeout_s=30))
        await asyncio.wait_for(conn.closed, 5)
        with pytest.raises(MqttError, match="nothing from the broker"):
            await pending
        with pytest.raises(MqttError, match="timed out"):  # accepted by the kernel, no CONNACK
            await connect(HOST, own_broker.port, "cp-silent", Inbox(), timeout_s=0.5)
        return conn

    assert "nothing from the broker" in (run(scenario()).close_reason or "")


def test_a_killed_broker_ends_the_connection_and_fails_pending_publishes(
    own_broker: Mosquitto,
) -> None:
    async def scenario() -> None:
        conn = await connect(HOST, own_broker.port, "cp-killed", Inbox(), keepalive_s=30)
        _freeze(own_broker)
        pending = asyncio.create_task(conn.publish("killed/x", b"lost"))
        await asyncio.sleep(0.1)  # the PUBLISH is written, the PUBACK never comes
        own_broker.stop(kill=True)
        await asyncio.wait_for(conn.closed, 5)
        with pytest.raises(MqttError, match="connection"):
            await pending
        with pytest.raises(MqttError, match="not connected"):
            await conn.publish("killed/y", b"after")
        with pytest.raises(MqttError, match="failed"):
            await connect(HOST, own_broker.port, "cp-killed", Inbox())

    run(scenario())


# -- framing, fed directly -------------------------------------------------------------------


class FakeTransport(asyncio.Transport):
    """Records writes; closing ends the connection on the next loop iteration, as asyncio's do."""

    def __init__(self, protocol: Connection) -> None:
        super().__init__()
        self.protocol = protocol
        self.writes: list[bytes] = []
        self.closing = False
        protocol.connection_made(self)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        if data == b"\xe0\x00":  # DISCONNECT: a broker closes the connection
            self.close()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()


CONNACK_OK = bytes([0x20, 0x03, 0x00, 0x00, 0x00])


def publish(
    topic: bytes, payload: bytes, packet_id: int | None = 1, props: bytes = b"\x00"
) -> bytes:
    head = 0x30 if packet_id is None else 0x32
    pid = b"" if packet_id is None else packet_id.to_bytes(2, "big")
    body = len(topic).to_bytes(2, "big") + topic + pid + props + payload
    assert len(body) < 128 * 128
    length = (
        bytes([len(body)]) if len(body) < 128 else bytes([len(body) % 128 | 0x80, len(body) // 128])
    )
    return bytes([head]) + length + body


def fed(chunks: list[bytes], on_message: Any = None) -> tuple[Connection, FakeTransport]:
    conn = Connection(on_message or Inbox())
    transport = FakeTransport(conn)
    for chunk in chunks:
        conn.data_received(chunk)  # never raises
    return conn, transport


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x30\xff\xff\xff\xff\x01", "malformed remaining length"),
        (b"\x00\x00", "unexpected packet 0x00"),
        (b"\x62\x02\x00\x01", "unexpected packet 0x62"),  # PUBREL: we never use QoS 2
        (b"\xf0\x00", "unexpected packet 0xF0"),  # AUTH
        (b"\x34" + publish(b"a", b"x")[1:], "QoS 2"),
        (b"\x32\x04\x00\x10ab", "malformed"),  # topic longer than the packet
        (publish(b"\xff\xfe", b"x"), "malformed packet: UnicodeDecodeError"),
        (publish(b"", b"x"), "malformed PUBLISH"),  # a topic alias we never allowed
        (publish(b"a", b"x", props=b"\x05\x26\x00\x01"), "malformed"),
        (CONNACK_OK + CONNACK_OK, "unexpected CONNACK"),  # a second one
        (b"\x40\x01\x00", "malformed PUBACK"),
        # CONNACKs as the first packet: properties longer than the packet, an unknown one
        (b"\x20\x03\x00\x00\x01\x7f", "properties overrun"),
        (b"\x20\x05\x00\x00\x02\x7f\x00", "unknown property 0x7F"),
        (publish(b"a", b"x") + b"\x30\xff\xff\xff\xff\x01" + publish(b"a", b"y"), "malformed"),
    ],
)
def test_malformed_input_closes_the_connection(data: bytes, reason: str) -> None:
    async def scenario() -> tuple[Connection, FakeTransport, Inbox]:
        inbox = Inbox()
        first = [] if data.startswith(b"\x20") else [CONNACK_OK]
        conn, transport = fed([*first, data], inbox)
        await asyncio.wait_for(conn.closed, 1)
        return conn, transport, inbox

    conn, transport, inbox = run(scenario())
    assert transport.closing
    assert reason in (conn.close_reason or "")
    assert len(inbox.messages) <= 1  # what came before the fault, and nothing after


def test_partial_and_packed_packets() -> None:
    stream = b"".join(
        [
            publish(b"t/1", b"one"),
            publish(b"t/0", b"qos0", packet_id=None),
            publish(b"t/long", b"L" * 300, packet_id=2),  # two-byte remaining length
            publish(b"t/props", b"p", packet_id=3, props=b"\x05\x02\x00\x00\x0e\x10"),
            bytes([0xD0, 0x00]),  # PINGRESP
        ]
    )
    expected = [(b"t/1", b"one"), (b"t/0", b"qos0"), (b"t/long", b"L" * 300), (b"t/props", b"p")]

    async def scenario(chunks: list[bytes]) -> list[tuple[str, bytes]]:
        inbox = Inbox(ack=False)
        conn, transport = fed([CONNACK_OK, *chunks], inbox)
        assert not transport.closing and conn.received == 4
        assert [a is None for a in inbox.acks] == [False, True, False, False]
        conn.close()
        await conn.closed
        return inbox.messages

    want = [(t.decode(), p) for t, p in expected]
    assert run(scenario([stream])) == want
    assert run(scenario([stream[i : i + 1] for i in range(len(stream))])) == want
    assert run(scenario([stream[:7], stream[7:400], stream[400:]])) == want


def test_acknowledgements_are_coalesced_and_each_counts_once() -> None:
    async def scenario() -> list[bytes]:
        inbox = Inbox(ack=False)
        conn, transport = fed([CONNACK_OK, publish(b"a", b"1", 1) + publish(b"a", b"2", 2)], inbox)
        first, second = inbox.acks
        assert first is not None and second is not None
        first()
        second()
        first()
        assert transport.writes == []  # not on receipt, not per call
        await asyncio.sleep(0)
        assert transport.writes == [b"\x40\x02\x00\x01\x40\x02\x00\x02"]
        # packet id 1 again, for a new message: the old ack must not acknowledge it
        conn.data_received(publish(b"a", b"3", 1))
        first()
        await asyncio.sleep(0)
        assert len(transport.writes) == 1
        third = inbox.acks[2]
        assert third is not None
        third()
        conn.close()  # queued acknowledgements go out before the DISCONNECT
        third()
        await conn.closed
        return transport.writes

    assert run(scenario())[1:] == [b"\x40\x02\x00\x01", b"\xe0\x00"]


def test_an_on_message_that_raises_closes_the_connection() -> None:
    def broken(topic: str, payload: bytes, ack: Ack | None) -> None:
        raise ValueError("consumer bug")

    async def scenario() -> Connection:
        conn, transport = fed([CONNACK_OK, publish(b"a", b"1") + publish(b"a", b"2")], broken)
        await conn.closed
        return conn

    assert "on_message raised ValueError('consumer bug')" in (run(scenario()).close_reason or "")


# -- a broker that reuses packet ids ---------------------------------------------------------

REUSE_CONFIG = (
    "allow_anonymous true\npersistence false\nmax_inflight_messages 40000\n"
    "max_queued_messages 1000000\nsys_interval 1\n"
)


@pytest.mark.slow
def test_packet_ids_the_broker_reuses_are_each_acknowledged_and_leave_it_nothing_held(
    tmp_path: Path,
) -> None:
    """Mosquitto numbers a message as it queues it, and its ids wrap at 65,535: with 40,000
    in flight unacknowledged and 30,000 more queued, its in-flight list takes the queue when
    the first one is acknowledged, and messages come with ids still awaiting a PUBACK. Each
    message gets its own PUBACK: afterwards the broker holds none of them (one PUBACK per id
    left the older message in its in-flight list for good, walked on every PUBACK after, and
    this test waiting for it until its timeout)."""
    broker = Mosquitto(tmp_path / "broker", extra_config=REUSE_CONFIG).start()
    total = 70_000

    async def scenario() -> tuple[int, int, int, int]:
        inbox = Inbox(ack=False)
        conn = await connect(HOST, broker.port, "cp-reuse", inbox, receive_maximum=40_000)
        await conn.subscribe([("reuse/x", 1)])
        held: list[int] = []  # the broker's count of messages it stores, every second
        watcher = await connect(
            HOST, broker.port, "cp-watch", lambda topic, payload, ack: held.append(int(payload))
        )
        await watcher.subscribe([("$SYS/broker/store/messages/count", 0)])
        while not held:
            await asyncio.sleep(0.1)
        before = held[-1]  # its own retained $SYS messages
        publisher = await connect(HOST, broker.port, "publisher", Inbox())
        for start in range(0, total, 2000):
            await asyncio.gather(
                *(publisher.publish("reuse/x", b"%d" % i) for i in range(start, start + 2000))
            )
        await close_and_wait(publisher)
        await inbox.until(40_000, 30)  # the broker's in-flight limit: the rest is queued
        assert len(inbox.messages) == 40_000
        inbox.acks[0]()  # type: ignore[misc]
        await inbox.until(total, 30)
        for ack in inbox.acks[1:]:
            ack()  # type: ignore[misc]
        # every message acknowledged: the broker lets go of all of them, keeping only its own
        # $SYS messages (a few dozen, more than before as it publishes more of them)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                while held[-1] > before + 100:
                    await asyncio.sleep(0.2)
        reused = conn.reused_ids
        await close_and_wait(conn)
        await close_and_wait(watcher)
        return len(inbox.messages), len(set(inbox.payloads)), held[-1] - before, reused

    try:
        received, distinct, still_held, reused = run(scenario(), timeout_s=120)
    finally:
        broker.stop(kill=True)
    assert received == distinct == total
    assert still_held <= 100
    if not reused:
        pytest.skip("this Mosquitto sent no packet id twice")


def test_a_reused_packet_id_gets_one_acknowledgement_per_message() -> None:
    async def scenario() -> tuple[list[bytes], int, int]:
        inbox = Inbox(ack=False)
        counted: list[None] = []
        conn = Connection(inbox, lambda: counted.append(None))
        transport = FakeTransport(conn)
        conn.data_received(CONNACK_OK)
        conn.data_received(publish(b"a", b"1", 7) + publish(b"a", b"2", 7) + publish(b"a", b"3", 7))
        first, second, third = inbox.acks
        assert first and second and third
        second()  # out of order: the broker takes each PUBACK for its oldest message
        first()
        first()  # each counts once
        await asyncio.sleep(0)
        writes = list(transport.writes)
        third()
        third()
        await asyncio.sleep(0)
        return [*writes, *transport.writes[len(writes) :]], conn.reused_ids, len(counted)

    writes, reused, counted = run(scenario())
    assert writes == [b"\x40\x02\x00\x07" * 2, b"\x40\x02\x00\x07"]
    assert reused == counted == 2


def test_a_session_taken_over_ends_closed_by_the_broker_without_a_reason(
    mosquitto: Mosquitto,
) -> None:
    """What :func:`control_plane.mqtt.bus.takeover_strikes` relies on: Mosquitto 2.0 closes a
    session that another client takes over with the end of the stream, its 0x8E DISCONNECT
    unsent (or, in a broker that sends it, with that reason); a close of our own is neither."""

    async def scenario() -> tuple[Connection, Connection]:
        first = await connect(HOST, mosquitto.port, "cp-stolen", Inbox(), clean_start=True)
        second = await connect(HOST, mosquitto.port, "cp-stolen", Inbox(), clean_start=True)
        await asyncio.wait_for(first.closed, 5)
        await close_and_wait(second)
        return first, second

    first, second = run(scenario())
    assert first.closed_by_peer or first.disconnect_reason == 0x8E
    assert first.disconnect_reason in (None, 0x8E)
    assert not second.closed_by_peer and second.disconnect_reason is None
