"""The private parts of uvicorn and httptools the agent builds on, checked one name at a time.

``agent/http/protocol.py`` subclasses uvicorn's httptools protocol (its parser callbacks,
``_start_asgi_task``, the fields of its request cycle), replaces ``on_header`` and rebuilds the
parser; ``agent/http/answers.py`` copies two of uvicorn's methods:
``RequestResponseCycle.receive`` as ``whole_receive`` and the response writing of
``RequestResponseCycle.send`` as ``respond``.
``agent/main.py`` overrides hooks of ``uvicorn.Server``. None of this is public API: pyproject
pins the uvicorn and httptools versions this file passes on. After an upgrade, a failing case's
id and message name what moved; read that name in the new version, adapt the agent, then the
expectation here. A method the agent overrides must be listed in ``SIGNATURES``
(:func:`test_every_override_is_in_the_contract`).

Where older versions part (with httptools 0.9.0 unless named): uvicorn up to 0.44
has no ``_start_asgi_task`` (its task is made inside ``on_headers_complete``, so the agent's
direct answers never happen); up to 0.52 a request's cycle is ``keep_alive`` whatever its
``Connection: close``, which ``send`` alone honours, so ``respond`` would keep such a connection
open; httptools up to 0.6.2 has no ``set_dangerous_leniencies``.

That the agent's protocol serves requests end to end through a real uvicorn on 127.0.0.1 is
tested elsewhere: tests/hardening/test_http_framing.py, tests/hardening/test_limits.py and
tests/agent/api/test_whole_body_answers.py. Here each name is checked alone, so that a change fails
with its name rather than with a wrong answer three layers up.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import importlib
import inspect
import textwrap
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from operator import attrgetter
from typing import Any

import httptools
import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from agent.http.answers import respond, whole_receive
from agent.http.connection import CYCLE_KEY
from agent.http.limits import HttpLimits
from agent.http.protocol import BoundedHttpProtocol, protocol_class
from agent.main import GracefulServer, server_config

IMPL = "uvicorn.protocols.http.httptools_impl"
PROTOCOL = f"{IMPL}.HttpToolsProtocol"
CYCLE = f"{IMPL}.RequestResponseCycle"
FLOW = "uvicorn.protocols.http.flow_control.FlowControl"
SERVER = "uvicorn.server.Server"
TESTED = f"(uvicorn {version('uvicorn')}, httptools {version('httptools')})"

POST = b"POST /x?y=1 HTTP/1.1\r\nHost: edge\r\nContent-Length: 3\r\n\r\n"


# -- what the checks run on: uvicorn's own protocol, as its server makes one ---------------


class FakeTransport:
    """What uvicorn's protocol calls of an ``asyncio.Transport``, recorded."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        addresses = {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}
        return addresses.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class App:
    """An ASGI app: reads the body, answers 200 ``ok``. Records what ``receive`` gave."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.received.append(await receive())
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})


class Held(HttpToolsProtocol):
    """uvicorn's protocol with its ASGI tasks held back: each cycle it would start is recorded
    with its app and whether it was started while its request's head was being completed."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.held: list[tuple[RequestResponseCycle, Any, bool]] = []
        self.completing_head = False

    def on_headers_complete(self) -> None:
        self.completing_head = True
        try:
            super().on_headers_complete()
        finally:
            self.completing_head = False

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self.held.append((cycle, app, self.completing_head))


@dataclass
class Wire:
    protocol: Any
    transport: FakeTransport
    state: ServerState
    config: uvicorn.Config
    app: App
    loop: asyncio.AbstractEventLoop

    def cycle(self) -> RequestResponseCycle:
        assert self.protocol.held, f"{PROTOCOL}._start_asgi_task was not called {TESTED}"
        cycle: RequestResponseCycle = self.protocol.held[0][0]
        return cycle


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    # Only a uvicorn that no longer calls _start_asgi_task leaves tasks (its own) behind.
    loop.run_until_complete(_cancel(asyncio.all_tasks(loop)))
    loop.close()


async def _cancel(tasks: set[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def connect(loop: asyncio.AbstractEventLoop, http: type[Any] = Held) -> Wire:
    """A protocol of class ``http`` on a fresh connection, made as ``Server.startup`` does."""
    app = App()
    config = uvicorn.Config(
        app,
        http=http,
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,
    )
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", b"Thu, 01 Jan 2026 00:00:00 GMT")]
    protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=state, app_state={}, _loop=loop
    )
    transport = FakeTransport()
    protocol.connection_made(transport)
    return Wire(protocol, transport, state, config, app, loop)


def resolve(dotted: str) -> Any:
    """The object a dotted name names, or an assertion that names what is missing."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for depth in range(split, len(parts)):
            owner = ".".join(parts[:depth])
            assert hasattr(obj, parts[depth]), (
                f"{dotted} is gone: {owner} has no {parts[depth]!r} {TESTED}"
            )
            obj = getattr(obj, parts[depth])
        return obj
    raise AssertionError(f"{dotted} is gone: no module of it imports {TESTED}")


# -- names and signatures: what the agent calls or overrides ----------------------------------

SIGNATURES: list[tuple[str, tuple[str, ...], bool]] = [
    # (name, parameter names, a coroutine function)
    (f"{PROTOCOL}.__init__", ("self", "config", "server_state", "app_state", "_loop"), False),
    (f"{PROTOCOL}.connection_made", ("self", "transport"), False),
    (f"{PROTOCOL}.connection_lost", ("self", "exc"), False),
    (f"{PROTOCOL}.data_received", ("self", "data"), False),
    (f"{PROTOCOL}.eof_received", ("self",), False),
    (f"{PROTOCOL}.pause_writing", ("self",), False),
    (f"{PROTOCOL}.resume_writing", ("self",), False),
    (f"{PROTOCOL}.on_message_begin", ("self",), False),
    (f"{PROTOCOL}.on_url", ("self", "url"), False),
    (f"{PROTOCOL}.on_header", ("self", "name", "value"), False),
    (f"{PROTOCOL}.on_headers_complete", ("self",), False),
    (f"{PROTOCOL}.on_body", ("self", "body"), False),
    (f"{PROTOCOL}.on_message_complete", ("self",), False),
    (f"{PROTOCOL}.on_response_complete", ("self",), False),
    (f"{PROTOCOL}.send_400_response", ("self", "msg"), False),
    (f"{PROTOCOL}._start_asgi_task", ("self", "cycle", "app"), False),
    (f"{PROTOCOL}._unset_keepalive_if_required", ("self",), False),
    (f"{PROTOCOL}.timeout_keep_alive_handler", ("self",), False),
    (f"{CYCLE}.receive", ("self",), True),
    (f"{CYCLE}.send", ("self", "message"), True),
    (f"{CYCLE}.run_asgi", ("self", "app"), True),
    (f"{FLOW}.resume_reading", ("self",), False),
    (f"{FLOW}.drain", ("self",), True),
    (f"{SERVER}.__init__", ("self", "config"), False),
    (f"{SERVER}.run", ("self", "sockets"), False),
    (f"{SERVER}.on_tick", ("self", "counter"), True),
    (f"{SERVER}.shutdown", ("self", "sockets"), True),
    (f"{SERVER}.capture_signals", ("self",), False),
    (f"{SERVER}.handle_exit", ("self", "sig", "frame"), False),
]


@pytest.mark.parametrize(("name", "params", "is_async"), SIGNATURES, ids=[s[0] for s in SIGNATURES])
def test_signature(name: str, params: tuple[str, ...], is_async: bool) -> None:
    found = resolve(name)
    got = tuple(inspect.signature(found).parameters)
    assert got == params, (
        f"{name} is gone or changed signature: the agent relies on ({', '.join(params)}), "
        f"found ({', '.join(got)}) {TESTED}"
    )
    assert inspect.iscoroutinefunction(found) == is_async, (
        f"{name} changed signature: it {'is no longer' if is_async else 'is now'} a coroutine "
        f"function {TESTED}"
    )


def test_every_override_is_in_the_contract() -> None:
    covered = {name for name, _, _ in SIGNATURES}
    pairs = [
        (BoundedHttpProtocol, HttpToolsProtocol, PROTOCOL),
        (GracefulServer, uvicorn.Server, SERVER),
    ]
    for ours, theirs, prefix in pairs:
        overridden = {f"{prefix}.{n}" for n in vars(ours) if callable(getattr(theirs, n, None))}
        assert overridden <= covered, f"add to SIGNATURES: {sorted(overridden - covered)}"


def test_status_line() -> None:
    """``STATUS_LINE[status]`` starts every response the agent writes itself."""
    table = resolve(f"{IMPL}.STATUS_LINE")
    for status in range(100, 600):
        line = table.get(status) if isinstance(table, dict) else None
        assert (
            isinstance(line, bytes)
            and line.startswith(b"HTTP/1.1 %d " % status)
            and line.endswith(b"\r\n")
        ), f"{IMPL}.STATUS_LINE is gone or changed: [{status}] is {line!r} {TESTED}"


def test_protocol_class() -> None:
    """The agent subclasses it; ``_Reader`` exists because uvloop reads a plain protocol's
    connection into bytes, which it does for any subclass of ``asyncio.Protocol``."""
    cls = resolve(PROTOCOL)
    assert issubclass(cls, asyncio.Protocol) and not issubclass(cls, asyncio.BufferedProtocol), (
        f"{PROTOCOL} changed: its bases are now {cls.__mro__[1:]} {TESTED}"
    )


# -- instance attributes: set in __init__ and connection_made, read and written by the agent --

# An expected type, or "is <path>" / "== <path>" for what it must be on the Wire.
Expected = str | type | tuple[type, ...]
PROTOCOL_ATTRIBUTES: dict[str, Expected] = {
    "transport": "is transport",
    "loop": "is loop",
    "app": "is config.loaded_app",  # what _start_asgi_task gets, with direct_app on it
    "connections": "is state.connections",
    "tasks": "is state.tasks",  # a shutdown waits for them
    "timeout_keep_alive": "== config.timeout_keep_alive",
    "timeout_keep_alive_task": (asyncio.TimerHandle, type(None)),
    "parser": httptools.HttpRequestParser,
    "url": bytes,
    "headers": list,
    "scope": dict,
    "expect_100_continue": bool,
    "cycle": RequestResponseCycle,
    # (cycle, app) of pipelined requests not started yet: their bodies are dropped when the
    # connection is lost, and a body over the budget is refused unanswered behind them
    "pipeline": deque,
}
CYCLE_ATTRIBUTES: dict[str, Expected] = {
    "scope": "is protocol.scope",
    "transport": "is transport",  # replaced by the agent's HeadHeld
    "flow": FlowControl,
    "flow.write_paused": bool,
    "body": bytearray,
    "more_body": bool,
    "message_event": asyncio.Event,
    "response_started": bool,
    "response_complete": bool,
    "waiting_for_100_continue": bool,
    "disconnected": bool,
    "keep_alive": bool,
    "default_headers": "== state.default_headers",
    "on_response": "== protocol.on_response_complete",
}


def check_attribute(wire: Wire, owner: Any, name: str, attr: str, expected: Expected) -> None:
    try:
        value = attrgetter(attr)(owner)
    except AttributeError:
        raise AssertionError(f"{name} is gone from a connection's instance {TESTED}") from None
    if isinstance(expected, str):
        op, path = expected.split(" ")
        other = attrgetter(path)(wire)
        ok = value is other if op == "is" else value == other
    else:
        ok = isinstance(value, expected)
    assert ok, f"{name} changed: expected {expected}, found {value!r} {TESTED}"


@pytest.mark.parametrize(
    ("attr", "expected"),
    PROTOCOL_ATTRIBUTES.items(),
    ids=[f"{PROTOCOL}.{a}" for a in PROTOCOL_ATTRIBUTES],
)
def test_protocol_attribute(loop: asyncio.AbstractEventLoop, attr: str, expected: Expected) -> None:
    wire = connect(loop)
    wire.protocol.data_received(POST + b"abc")
    check_attribute(wire, wire.protocol, f"{PROTOCOL}.{attr}", attr, expected)


@pytest.mark.parametrize(
    ("attr", "expected"), CYCLE_ATTRIBUTES.items(), ids=[f"{CYCLE}.{a}" for a in CYCLE_ATTRIBUTES]
)
def test_cycle_attribute(loop: asyncio.AbstractEventLoop, attr: str, expected: Expected) -> None:
    wire = connect(loop)
    wire.protocol.data_received(POST + b"abc")
    check_attribute(wire, wire.cycle(), f"{CYCLE}.{attr}", attr, expected)


@pytest.mark.parametrize("attr", ["started", "should_exit"], ids=lambda a: f"{SERVER}.{a}")
def test_server_attribute(attr: str) -> None:
    server = uvicorn.Server(uvicorn.Config(App(), log_config=None))
    assert getattr(server, attr, None) is False, (
        f"{SERVER}.{attr} is gone or changed: expected False on a new server {TESTED}"
    )


# -- httptools: the parser the agent rebuilds and feeds ---------------------------------------


class Recorder:
    """A parser protocol that records the callbacks httptools makes, and can fail one."""

    def __init__(self, fail_in: str = "") -> None:
        self.calls: list[str] = []
        self.fail_in = fail_in
        self.upgrade: bool | None = None
        self.parser = httptools.HttpRequestParser(self)

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_in:
            raise LookupError(name)

    def on_message_begin(self) -> None:
        self._call("on_message_begin")

    def on_url(self, url: bytes) -> None:
        self._call("on_url")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._call("on_header")

    def on_headers_complete(self) -> None:
        self.upgrade = self.parser.should_upgrade()
        self._call("on_headers_complete")

    def on_body(self, body: bytes) -> None:
        self._call("on_body")

    def on_message_complete(self) -> None:
        self._call("on_message_complete")


def test_httptools_request_parser_calls_back_and_takes_a_memoryview() -> None:
    """The agent's ``buffer_updated`` feeds the parser a memoryview of its read buffer."""
    recorder = Recorder()
    recorder.parser.feed_data(memoryview(bytearray(POST + b"abc")))
    expected = ["on_message_begin", "on_url", "on_header", "on_header", "on_headers_complete"]
    expected += ["on_body", "on_message_complete"]
    assert recorder.calls == expected, (
        f"httptools.HttpRequestParser.feed_data changed: callbacks {recorder.calls} {TESTED}"
    )


def test_httptools_set_dangerous_leniencies() -> None:
    parser = httptools.HttpRequestParser(Recorder())
    try:
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    except (AttributeError, TypeError) as exc:
        raise AssertionError(
            "httptools.HttpRequestParser.set_dangerous_leniencies(lenient_data_after_close=) "
            f"is gone or changed signature: {exc} {TESTED}"
        ) from exc


def test_httptools_should_upgrade() -> None:
    """The agent refuses an upgrade in ``on_headers_complete``, asking ``should_upgrade``."""
    recorder = Recorder()
    head = b"GET / HTTP/1.1\r\nHost: edge\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    with pytest.raises(httptools.HttpParserUpgrade):
        recorder.parser.feed_data(head)
    assert recorder.upgrade is True, (
        f"httptools.HttpRequestParser.should_upgrade changed: False for an Upgrade request {TESTED}"
    )


@pytest.mark.parametrize("callback", ["on_url", "on_header", "on_headers_complete"])
def test_httptools_callback_error_is_an_http_parser_error(callback: str) -> None:
    """The agent stops the parser by raising from these callbacks once it has answered."""
    recorder = Recorder(fail_in=callback)
    with pytest.raises(httptools.HttpParserError) as raised:
        recorder.parser.feed_data(POST)
    assert isinstance(raised.value.__context__, LookupError), (
        f"httptools.HttpParserError changed: an error in {callback} surfaced as "
        f"{raised.value!r} {TESTED}"
    )


def test_httptools_callback_error_class() -> None:
    cls = resolve("httptools.HttpParserCallbackError")
    assert issubclass(cls, httptools.HttpParserError), (
        f"httptools.HttpParserCallbackError changed: no longer an HttpParserError {TESTED}"
    )


# -- uvicorn's behaviour the agent's overrides and copies rely on ------------------------------


def parser_setup(source: str) -> list[str]:
    """What a function's source does to ``self.parser``: its assignments and calls."""
    found = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [
            "self.parser"
        ]:
            found.append(f"self.parser = {ast.unparse(node.value)}")
        elif isinstance(node, ast.Call) and ast.unparse(node.func).startswith("self.parser."):
            found.append(ast.unparse(node))
    return sorted(found)


def test_init_builds_the_parser_as_the_agent_rebuilds_it() -> None:
    """``BoundedHttpProtocol.buffer_updated`` builds a new parser, as uvicorn's ``__init__``
    does, for the request after a body read past the parser."""
    theirs = parser_setup(inspect.getsource(HttpToolsProtocol.__init__))
    ours = [
        line
        for line in parser_setup(inspect.getsource(BoundedHttpProtocol.buffer_updated))
        if "feed_data" not in line
    ]
    assert theirs == ours, (
        f"{PROTOCOL}.__init__ changed how it builds its parser: {theirs}; "
        f"agent.http.protocol.BoundedHttpProtocol.buffer_updated rebuilds it as {ours} "
        f"{TESTED}"
    )


def test_data_received_answers_a_callback_error_with_send_400_response(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The agent's refusals raise from a parser callback after answering; uvicorn must catch
    it and call ``send_400_response``, which the agent then keeps silent."""

    class Refusing(Held):
        def on_url(self, url: bytes) -> None:
            raise LookupError("refused")

        def send_400_response(self, msg: str) -> None:
            self.refused = msg

    wire = connect(loop, Refusing)
    try:
        wire.protocol.data_received(POST)
    except LookupError as exc:
        raise AssertionError(
            f"{PROTOCOL}.data_received changed: a callback's error escaped it {TESTED}"
        ) from exc
    assert hasattr(wire.protocol, "refused"), (
        f"{PROTOCOL}.send_400_response is no longer called for a parser error {TESTED}"
    )


def test_start_asgi_task_is_called_from_the_head_and_for_pipelined_requests_later(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The agent decides in ``_start_asgi_task`` whether to answer from its callbacks only
    when called from ``on_headers_complete``; a pipelined request starts from the response
    before it completing."""
    wire = connect(loop)
    get = b"GET /%s HTTP/1.1\r\nHost: edge\r\n\r\n"
    wire.protocol.data_received(get % b"a" + get % b"b")
    held = wire.protocol.held
    name = f"{PROTOCOL}._start_asgi_task"
    assert [(app, head) for _, app, head in held] == [(wire.app, True)], (
        f"{name} changed: not called once, with config.loaded_app, from on_headers_complete "
        f"for the first of two pipelined requests: {held} {TESTED}"
    )
    loop.run_until_complete(held[0][0].run_asgi(wire.app))
    assert [head for _, _, head in held] == [True, False] and held[1][0] is wire.protocol.cycle, (
        f"{name} changed: not called for a pipelined request once the one before it was "
        f"answered: {held} {TESTED}"
    )


def test_run_asgi_hands_the_app_the_receive_its_cycle_holds(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The agent replaces ``cycle.receive`` on the instance (``whole_receive``)."""
    wire = connect(loop)
    wire.protocol.data_received(POST + b"abc")
    cycle = wire.cycle()
    replaced = {"type": "http.request", "body": b"replaced", "more_body": False}

    async def receive() -> dict[str, Any]:
        return replaced

    cycle.receive = receive  # type: ignore[method-assign]
    loop.run_until_complete(cycle.run_asgi(wire.app))
    assert wire.app.received == [replaced], (
        f"{CYCLE}.run_asgi changed: it no longer hands the app self.receive {TESTED}"
    )


HEADERS = [
    (b"Host", b"edge"),
    (b"Content-Length", b"3"),
    (b"EXPECT", b"100-Continue"),
    (b"X-Spaced", b"a b"),
]


def test_on_header_does_what_the_agent_replacement_does(loop: asyncio.AbstractEventLoop) -> None:
    """``BoundedHttpProtocol.on_header`` replaces uvicorn's without calling it."""
    theirs, ours = connect(loop).protocol, connect(loop, bounded()).protocol
    theirs.on_message_begin()
    ours.on_message_begin()
    before = {k: _snapshot(v) for k, v in vars(theirs).items()}
    for header, value in HEADERS:
        theirs.on_header(header, value)
        ours.on_header(header, value)
    after = vars(theirs)
    touched = {k for k in after if k not in before or not _same(before[k], after[k])}
    name = f"{PROTOCOL}.on_header"
    copy_ = "agent.http.protocol.BoundedHttpProtocol.on_header"
    assert touched <= {"headers", "expect_100_continue"}, (
        f"{name} changed: it now sets {sorted(touched)}; {copy_} replaces it {TESTED}"
    )
    got = (theirs.headers, theirs.expect_100_continue)
    replaced = (ours.headers, ours.expect_100_continue)
    assert got == replaced, (
        f"{name} changed: (headers, expect_100_continue) are {got}; {copy_} gives {replaced} "
        f"{TESTED}"
    )
    assert theirs.scope["headers"] is theirs.headers, (
        f"{name} changed: the headers it collects are not the scope's {TESTED}"
    )


def _snapshot(value: Any) -> Any:
    return copy.copy(value) if isinstance(value, list | dict | set | bytearray) else value


def _same(a: Any, b: Any) -> bool:
    return a is b or a == b


def bounded() -> type[BoundedHttpProtocol]:
    limits = HttpLimits(
        max_header_bytes=8192,
        header_timeout_s=5.0,
        body_timeout_s=5.0,
        max_connections=8,
        max_concurrent_requests=8,
        whole_body_bytes=1 << 20,
    )
    return protocol_class(limits)


def _received(wire: Wire, message: dict[str, Any]) -> tuple[Any, ...]:
    cycle = wire.cycle()
    body = message.get("body")
    shown = {**message, "body": bytes(body)} if body is not None else message
    state = (cycle.body, cycle.more_body, cycle.message_event.is_set())
    return shown, state, cycle.waiting_for_100_continue, bytes(wire.transport.written)


RECEIVE_CASES = {
    "body": (POST + b"abc", False),
    "expect-100-continue": (
        POST.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n") + b"abc",
        False,
    ),
    "client-gone": (POST, True),
}


@pytest.mark.parametrize("case", list(RECEIVE_CASES))
def test_receive_does_what_whole_receive_copies(loop: asyncio.AbstractEventLoop, case: str) -> None:
    """``whole_receive`` is uvicorn's ``receive`` handing over the body's buffer itself."""
    data, lost = RECEIVE_CASES[case]
    theirs, ours = connect(loop), connect(loop)
    for wire in (theirs, ours):
        wire.protocol.data_received(data)
        if lost:
            wire.protocol.connection_lost(None)
    got = _received(theirs, loop.run_until_complete(theirs.cycle().receive()))
    copied = _received(ours, loop.run_until_complete(whole_receive(ours.cycle())()))
    assert got == copied, (
        f"{CYCLE}.receive changed ({case}): it gives {got}; its copy "
        f"agent.http.answers.whole_receive gives {copied} {TESTED}"
    )


def test_receive_answers_a_lost_connection_with_a_disconnect_even_with_its_body_in(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """``BoundedHttpProtocol.connection_lost`` drops the body of a lost request's cycle (else
    it waits for the cycle collector): nothing may read it after the loss."""
    wire = connect(loop)
    wire.protocol.data_received(POST + b"abc")  # the whole body, not yet received
    wire.protocol.connection_lost(None)
    message = loop.run_until_complete(wire.cycle().receive())
    assert message == {"type": "http.disconnect"}, (
        f"{CYCLE}.receive changed: after connection_lost it gives {message} {TESTED}"
    )


def _sent(wire: Wire) -> tuple[Any, ...]:
    cycle = wire.cycle()
    return (
        bytes(wire.transport.written),
        wire.transport.closed,
        (cycle.response_started, cycle.response_complete, cycle.message_event.is_set()),
        cycle.waiting_for_100_continue,
        wire.state.total_requests,  # on_response was called
    )


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
def test_send_writes_what_respond_copies(loop: asyncio.AbstractEventLoop, close: bool) -> None:
    """``respond`` writes a whole response as uvicorn's ``send`` does for its two messages."""
    data = POST.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") if close else POST
    headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
    theirs, ours = connect(loop), connect(loop)
    for wire in (theirs, ours):
        wire.protocol.data_received(data + b"abc")
    cycle = theirs.cycle()
    start = {"type": "http.response.start", "status": 200, "headers": headers}
    loop.run_until_complete(cycle.send(start))  # type: ignore[arg-type]
    loop.run_until_complete(cycle.send({"type": "http.response.body", "body": b"{}"}))
    scope = ours.cycle().scope
    scope[CYCLE_KEY] = ours.cycle()  # type: ignore[literal-required]
    assert respond(scope, 200, headers, b"{}")  # type: ignore[arg-type]
    assert _sent(theirs) == _sent(ours), (
        f"{CYCLE}.send changed: it gives {_sent(theirs)}; its copy "
        f"agent.http.answers.respond gives {_sent(ours)} {TESTED}"
    )


# -- uvicorn's Config and Server, as agent/main.py uses them -----------------------------------


def test_config_takes_the_agents_protocol_class_and_app_as_they_are(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """``_start_asgi_task`` finds ``direct_app`` on the app uvicorn hands it: unwrapped."""
    cls = bounded()
    wire = connect(loop, cls)
    assert wire.config.http_protocol_class is cls, (
        f"uvicorn.Config.http_protocol_class changed: {wire.config.http_protocol_class!r} "
        f"for http={cls!r} {TESTED}"
    )
    assert wire.config.loaded_app is wire.app, (
        f"uvicorn.Config.loaded_app changed: {wire.config.loaded_app!r}, not the app given {TESTED}"
    )


def test_config_takes_the_parameters_server_config_passes() -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(server_config)))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    passed = {
        k.arg or "**" for c in calls if ast.unparse(c.func) == "uvicorn.Config" for k in c.keywords
    }
    assert passed, "agent.main.server_config no longer calls uvicorn.Config(...)"
    params = set(inspect.signature(uvicorn.Config).parameters)
    assert passed <= params, f"uvicorn.Config lost parameters {sorted(passed - params)} {TESTED}"


@pytest.mark.parametrize("param", ["timeout_keep_alive", "timeout_graceful_shutdown"])
def test_config_keeps_a_timeout_under_a_second(param: str) -> None:
    """The agent passes seconds as floats, which uvicorn types as int but uses as given."""
    config = uvicorn.Config(App(), log_config=None, **{param: 0.25})
    assert getattr(config, param) == 0.25, (
        f"uvicorn.Config.{param} changed: 0.25 became {getattr(config, param)!r} {TESTED}"
    )


def _server_calls() -> set[str]:
    """The ``self.<method>`` of ``Server`` that its methods call or reference."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(uvicorn.Server)))
    found = set()
    for method in ast.walk(tree):
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(method):
                if (
                    isinstance(node, ast.Attribute)
                    and ast.unparse(node.value) == "self"
                    and node.attr != method.name
                ):
                    found.add(node.attr)
    return found


@pytest.mark.parametrize("hook", ["on_tick", "shutdown", "capture_signals", "handle_exit"])
def test_server_uses_the_hook_the_agent_overrides(hook: str) -> None:
    """GracefulServer overrides or hands on these; uvicorn must still call them."""
    assert hook in _server_calls(), f"{SERVER}.{hook} is no longer called by the server {TESTED}"


def test_server_waits_for_server_state_tasks_at_shutdown() -> None:
    """Answers started from the agent's callbacks join ``ServerState.tasks`` to be waited for."""
    source = inspect.getsource(uvicorn.Server)
    assert "self.server_state.tasks" in source, (
        f"{SERVER} changed: it no longer waits for ServerState.tasks at shutdown {TESTED}"
    )
