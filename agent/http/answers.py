"""What the agent writes on a request's connection itself, past uvicorn's ASGI messages, and
the ``receive`` that hands a body collected whole to its handler.

uvicorn's request cycle speaks ASGI: a response is two ``send`` messages, each checked and
counted, and a body is a ``receive`` message holding a ``bytes`` copy of it. The agent goes
around that where it pays: :func:`respond` writes a whole response of its own making in one
go, which is how the inference fast path (:mod:`agent.api.fastpath`) answers, from an ASGI
task or from the connection's callbacks with no task at all (:func:`respond_when_drained`
when the client is not reading); :func:`refusal_response` is the answer the protocol writes
before any ASGI code runs (a limit or deadline passed); :class:`HeadHeld` is the transport a
request cycle writes on, so that a response's head and body leave in one write; and
:func:`whole_receive` is the cycle's ``receive`` for a body collected whole.

:func:`whole_receive` and :func:`respond` are copies of uvicorn's
``RequestResponseCycle.receive`` and ``send``: tests/agent/api/test_uvicorn_contract.py checks
each against the uvicorn version pinned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from agent.http.connection import CYCLE_KEY


class HeadHeld:
    """The connection's transport as its request cycles see it: a response's head is held until
    its body (or the response's end), so a small response leaves in one write, one system call,
    instead of two. Informational responses (``100 Continue``) are not held."""

    __slots__ = ("transport", "expect_head", "_head")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.expect_head = True
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if len(data) < 65536:
                self.transport.write(head + data)
            else:  # not worth a copy of a large body
                self.transport.writelines((head, data))
        elif self.expect_head and not data.startswith(b"HTTP/1.1 1"):
            self.expect_head = False
            self._head = data
        else:
            self.transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self.transport.write(head)

    def next_response(self) -> None:
        self.flush()
        self.expect_head = True

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


def whole_receive(cycle: RequestResponseCycle) -> Callable[[], Any]:
    """uvicorn's ``receive`` for a body collected whole, handing the ASGI app the buffer the
    body was read into (a ``memoryview``) instead of a ``bytes`` copy of it."""

    async def receive() -> dict[str, Any]:
        if cycle.waiting_for_100_continue and not cycle.transport.is_closing():
            cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        if not cycle.disconnected and not cycle.response_complete:
            cycle.flow.resume_reading()
            await cycle.message_event.wait()
            cycle.message_event.clear()
        if cycle.disconnected or cycle.response_complete:
            return {"type": "http.disconnect"}
        body, cycle.body = cycle.body, bytearray()
        return {"type": "http.request", "body": body, "more_body": cycle.more_body}

    return receive


def respond(scope: Scope, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """Write a whole response of the agent's own making on its request's connection, as
    uvicorn's ``send`` would for its two ASGI messages, less the work a response whose headers
    are known to be valid does not need (a regular expression per header name and value, the
    messages, the content length counted down); False, and nothing written, when the request
    is not on this protocol, or when its client is not reading what it was sent (uvicorn's
    ``send`` then waits for the transport to drain before it writes more). ``headers`` must
    hold the content length."""
    cycle: RequestResponseCycle | None = scope.get(CYCLE_KEY)
    if cycle is None or cycle.response_started or cycle.flow.write_paused:
        return False
    if cycle.disconnected:
        return True
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    head = [STATUS_LINE[status]]
    for name, value in (*cycle.default_headers, *headers):
        head += (name, b": ", value, b"\r\n")
    if not cycle.keep_alive:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    cycle.transport.write(b"".join(head))  # held by HeadHeld until the body: one write
    cycle.transport.write(body)
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
    return True


def respond_when_drained(
    scope: Scope, status: int, headers: list[tuple[bytes, bytes]], body: bytes, tasks: set[Any]
) -> None:
    """:func:`respond` once the client has read what it was sent, as uvicorn's ``send`` waits
    for it, in a task that joins ``tasks`` (uvicorn's: a shutdown waits for it)."""
    cycle: RequestResponseCycle = scope[CYCLE_KEY]

    async def when_drained() -> None:
        await cycle.flow.drain()
        respond(scope, status, headers, body)

    task = asyncio.get_running_loop().create_task(when_drained(), name="respond-when-drained")
    tasks.add(task)
    task.add_done_callback(tasks.discard)


REFUSAL_CODES = {413: "payload_too_large", 503: "overloaded"}
"""The error code of a refusal that leaves its connection open, by status."""


def refusal_response(
    status: int, code: str, message: str, retry_after_s: int, *, close: bool
) -> bytes:
    """A whole error response, ``{"error": message, "code": code}``, as the protocol writes it
    for a request it turns away."""
    body = orjson.dumps({"error": message, "code": code})
    head = [
        STATUS_LINE[status],
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
    ]
    if close:
        head.append(b"connection: close\r\n")
    if retry_after_s:
        head.append(b"retry-after: %d\r\n" % retry_after_s)
    return b"".join([*head, b"\r\n", body])
