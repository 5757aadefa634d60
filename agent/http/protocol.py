"""uvicorn's httptools protocol with the limits it lacks: header bytes, deadlines for the
request head and body, an idle limit on new connections, and a cap on open connections; a
hook that tells a request's handler when its client is gone; and bodies of a declared length
collected whole in one buffer, instead of in 64 KiB steps that each pause reading and wake the
handler.

A large body collected whole is also received straight into its buffer: its connection then
reads through a :class:`asyncio.BufferedProtocol` (:class:`_Reader`) whose buffer, once a
request's head is parsed, is the rest of that request's body. uvicorn's path copied a 600 KB
image five times on the event loop before the handler saw it (the loop's read buffer into a
bytes object, the parser's callback into another, into uvicorn's buffer, ``bytes()`` of that
for the ASGI message, and a join of it with the stream's closing empty chunk); now the kernel
writes it once and the handler gets that buffer. Such a connection reads a request's head in
reads of :data:`HEAD_READ_BYTES`, so only the little of the body that arrives with its head
goes through the parser, and the buffer is not zero-filled first: the kernel writes every byte
of it before the handler can see it.

The bodies all connections hold at once are budgeted (``max_inflight_body_bytes``): a body with
a declared length is taken from the budget once its head is parsed, or refused with 503 unread
when it would pass it; a chunked one as it grows, refused (and its connection closed) the moment
it would. A request gives its bytes back when its response is complete, or its connection lost,
and a connection lost, or closed for its deadline, drops the body it was reading at once (see
:meth:`BoundedHttpProtocol.connection_lost`). Every refusal is counted by its
:class:`~agent.metrics.RefusalReason`, here and, through the request's scope
(:data:`REFUSED_KEY`), in the application.

These act before any ASGI code runs, where a slow or hostile client would otherwise hold memory
or a connection for free, and where refusing a request under load is cheapest (a deadline here
is one timer per request whose body spans packets, not a timeout around every ``receive``).
uvicorn buffers headers without bound under httptools (its ``h11_max_incomplete_event_size``
applies to h11 only), arms its keep-alive timer only after a first response, and
``limit_concurrency`` counts connections *and* tasks together, so one surge turns away the
requests of connections already being served.

The limits and the counts a server's connections share are in :mod:`agent.http.limits`,
what the protocol hands the application through a request's scope in
:mod:`agent.http.connection`, and what it writes on a connection itself in
:mod:`agent.http.answers`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

import httptools
import numpy as np
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from agent.http.answers import REFUSAL_CODES, HeadHeld, refusal_response, whole_receive
from agent.http.connection import CONNECTION_KEY, CYCLE_KEY, REFUSED_KEY, Connection, DirectApp
from agent.http.limits import (
    BUFFERED_BODY_BYTES,
    HEAD_READ_BYTES,
    BodyBudget,
    HttpLimits,
    InFlight,
)
from agent.metrics import RefusalReason


def _uncounted(reason: RefusalReason) -> None:
    """Where no metrics are wired (the protocol alone, in tests)."""


class _Reader(asyncio.BufferedProtocol):
    """What the transport calls: reads go into the buffer the connection's protocol gives
    (uvloop treats a subclass of ``asyncio.Protocol``, as uvicorn's protocol is, as a plain
    protocol, so the connection is switched to this one once made)."""

    def __init__(self, protocol: BoundedHttpProtocol) -> None:
        self.get_buffer = protocol.get_buffer  # type: ignore[method-assign]
        self.buffer_updated = protocol.buffer_updated  # type: ignore[method-assign]
        self.eof_received = protocol.eof_received  # type: ignore[method-assign]
        self.connection_lost = protocol.connection_lost  # type: ignore[method-assign]
        self.pause_writing = protocol.pause_writing  # type: ignore[method-assign]
        self.resume_writing = protocol.resume_writing  # type: ignore[method-assign]


class _Answered(Exception):
    """Raised in a parser callback to stop parsing once a refusal has been written."""


class BoundedHttpProtocol(HttpToolsProtocol):
    limits: ClassVar[HttpLimits]
    in_flight: ClassVar[InFlight]
    budget: ClassVar[BodyBudget]
    refused: ClassVar[staticmethod[[RefusalReason], None]]
    """Counts a request turned away (``AgentMetrics.count_refusal``)."""
    head_buffer: ClassVar[memoryview]
    """Shared by the server's connections reading through :class:`_Reader`: a read is handed to
    the parser, which copies what it keeps, before the event loop reads anything else."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._buffered = False  # reading through _Reader
        self._answered = False
        self._discarding = False  # the body of a refused request is parsed and dropped
        self._counted = 0  # requests of this connection in in_flight
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._in_body = False  # head parsed, body not complete
        self._declared = -1  # the request's Content-Length, -1 if none or not a number
        self._whole: memoryview | None = None  # the body being collected whole, if it is
        self._filled = 0
        self._growing = False  # the body is taken from the budget as it arrives (chunked)
        self._body_bytes = 0  # taken from the budget by the body being read
        # taken by each request whose body is read and whose response is not complete, oldest
        # first (pipelined requests answer in order)
        self._held: deque[int] = deque()
        self._connection = Connection()
        self._heads_up = False
        self._direct: DirectApp | None = None  # answers the request whose body is read
        self._writer = HeadHeld(self.transport)
        # The connection is refused at its first request, with a proper HTTP answer.
        self._over_limit = len(self.connections) > self.limits.max_connections
        # uvicorn arms the idle timer only after a response: a connection that never sends
        # anything would otherwise stay open for ever.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def _into_whole(self) -> bool:
        """Whether the next read goes straight into the body being collected: its head and
        its first packet's share of the body went through the parser, the rest bypasses it."""
        return self._whole is not None and self._filled < len(self._whole)

    def get_buffer(self, sizehint: int) -> memoryview:
        whole = self._whole
        if whole is not None and self._filled < len(whole):  # _into_whole
            return whole[self._filled :]  # the kernel reads no further than this body
        return self.head_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if not self._into_whole():
            self.data_received(self.head_buffer[:nbytes])  # type: ignore[arg-type]
            return
        self._filled += nbytes
        if self._whole is not None and self._filled == len(self._whole):
            # The parser still waits for the body it never saw: the next request gets a new one.
            self.parser = httptools.HttpRequestParser(self)
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
            self.on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        if self._whole is not None:
            self._whole.release()
            self._whole = None
        self.in_flight.count -= self._counted
        self._counted = 0
        self.budget.used -= self._body_bytes + sum(self._held)
        self._body_bytes = 0
        self._held.clear()
        super().connection_lost(exc)
        # A body not handed over is dropped now. Its cycle is in reference cycles (with this
        # protocol through cycle.on_response, with its scope, with whole_receive), so it
        # would wait for the cycle collector, holding the body: 200 half-sent bodies of 1 MiB
        # held 108 MB until a gc ran. A cycle lost answers receive() with a disconnect only.
        if self.cycle is not None:
            self.cycle.body = bytearray()
        for cycle, _ in self.pipeline:  # pipelined requests never started
            cycle.body = bytearray()
        self._connection.lose()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # Most bodies arrive with their head: the timer is armed only for one that does not.
        if self._in_body and self._body_timer is None and not self.transport.is_closing():
            self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_late)

    def on_response_complete(self) -> None:
        self._writer.next_response()
        if self._counted:
            self._counted -= 1
            self.in_flight.count -= 1
        if self._held:  # the oldest request with its body read: the one answered
            self.budget.used -= self._held.popleft()
        super().on_response_complete()

    def on_message_begin(self) -> None:
        # A request began: the connection is not idle. uvicorn disarms the idle timer only at
        # the start of a read, and the end of a refused request's skipped body arms it: a request
        # in the same read as that end kept it armed and was cut off after keep_alive_s.
        self._unset_keepalive_if_required()
        super().on_message_begin()
        self._direct = None
        self.scope[CONNECTION_KEY] = self._connection  # type: ignore[literal-required]
        self.scope[REFUSED_KEY] = self.refused  # type: ignore[literal-required]
        self._head_bytes = 0
        self._declared = -1
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's own on_header, in one call with the count: the parser calls this for every
        # header of every request
        self._head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self._head_bytes > self.limits.max_header_bytes:
            self._count(0)  # answers 431
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp keeps trailing whitespace (RFC 9110 5.5 does not)
        if name == b"content-length":
            self._declared = int(value) if value.isdigit() and len(value) < 19 else -1
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        if self.parser.should_upgrade():
            # httptools then tells llhttp the message has no body and the rest of the stream is
            # another protocol's: the body is never parsed, and uvicorn would hand the handler
            # a body buffer that nothing filled (and count a request that never ends). The
            # agent speaks no other protocol (no WebSocket, no h2c): refused, before anything
            # is counted or allocated. RFC 9110 lets a server ignore Upgrade; httptools cannot.
            upgrade = dict(self.headers).get(b"upgrade", b"").decode("latin-1")[:40]
            self._answer(
                400,
                "upgrade_not_supported",
                f"protocol upgrades are not supported (Upgrade: {upgrade or '?'}, or CONNECT):"
                " send the request without Connection: Upgrade",
                RefusalReason.BAD_HTTP,
            )
        if self._over_limit:
            self._answer(
                503,
                "overloaded",
                f"too many open connections (max_connections={self.limits.max_connections})",
                RefusalReason.MAX_CONNECTIONS,
                retry_after_s=1,
            )
        # Refused here, before an ASGI task exists: a refusal costs a few microseconds, so a
        # flood of them cannot starve the requests admitted. The connection stays open (a
        # close with the body unread would reset it, losing the answer); the body is skipped.
        counted = self.url.split(b"?", 1)[0] not in self.limits.open_paths
        if counted:
            limit = self.limits.max_concurrent_requests
            if self.in_flight.count >= limit and not self._responding():
                self._refuse_and_discard(
                    503,
                    f"{self.in_flight.count} requests are in flight, the limit of "
                    f"max_concurrent_requests={limit}",
                    RefusalReason.MAX_CONCURRENT_REQUESTS,
                )
                return
        # A declared body is taken from the budget whole, before a byte of it is read; one
        # over the size limit is refused by its handler (413) and one without a length (or
        # with no size limit here) is taken as it arrives (on_body).
        declared = self._declared
        upfront = 0 < declared and (
            declared <= self.limits.whole_body_bytes or not self.limits.whole_body_bytes
        )
        self._growing = not upfront
        if upfront and not self.budget.fits(declared):
            self._over_budget(declared)
            return
        if counted:
            self.in_flight.count += 1
            self._counted += 1
        self._in_body = True
        previous = self.cycle
        self._heads_up = True  # _start_asgi_task: called for this request's head
        try:
            super().on_headers_complete()
        finally:
            self._heads_up = False
        if self.cycle is not previous:  # a request cycle was made (not an upgrade)
            self.cycle.transport = self._writer  # type: ignore[assignment]
            self.scope[CYCLE_KEY] = self.cycle  # type: ignore[literal-required]
            if upfront:
                self._body_bytes = declared
                self.budget.used += declared
            if 0 < self._declared <= self.limits.whole_body_bytes:
                self._collect_whole(self._declared)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """A request the app answers from :meth:`on_message_complete` gets no ASGI task: its
        body collected whole, it is handed over as it is (:class:`DirectApp`). Others, and a
        pipelined request started after the one before it, get uvicorn's task.

        Only bodies of :data:`BUFFERED_BODY_BYTES` or more: ``mlp``, JSON, concurrency 32
        (bodies of about 3 KB) served fewer requests answered this way (``python -m
        benchmarks.serving.ab``, 2026-12-05: 6,305-6,558 against 7,812-7,930 requests/s, and
        7,467-7,638 against 7,450-8,124 with small bodies left to the task; perhaps because a task
        lets the loop parse every connection's read before any request is decoded and queued)."""
        direct: DirectApp | None = getattr(app, "direct_app", None)
        if (
            direct is not None
            and self._heads_up
            and BUFFERED_BODY_BYTES <= self._declared <= self.limits.whole_body_bytes
            and not self.expect_100_continue  # the client waits for a receive() to go on
            and direct.takes(cycle.scope)  # type: ignore[arg-type]
        ):
            self._direct = direct
            return
        super()._start_asgi_task(cycle, app)

    def _collect_whole(self, size: int) -> None:
        """Collect the body into one buffer of its declared size, and wake the handler once,
        when it is complete. uvicorn appends each packet to a growing buffer, pauses reading
        past 64 KiB until the handler takes it, and wakes the handler every time: for a body
        of 600 KB, ten pauses and wake-ups and two more copies. The handler reads a declared
        body whole anyway, and a body over the limit never gets here (it is refused unread)."""
        self._filled = 0
        if size < BUFFERED_BODY_BYTES:
            self.cycle.body = bytearray(size)
            self._whole = memoryview(self.cycle.body)
            return
        # Not zero-filled, as bytearray(size) is: that memset of 600 KB was 12 % of the event
        # loop's user time serving cnn (perf, 2026-12-04). Nothing reads the buffer before the
        # body is complete (whole_receive hands it over only then).
        self.cycle.body = np.empty(size, np.uint8).data  # type: ignore[assignment]
        # a view of its own, released once the body is complete; cycle.body goes to the handler
        self._whole = memoryview(self.cycle.body)
        self.cycle.receive = whole_receive(self.cycle)  # type: ignore[method-assign]
        if not self._buffered:  # from the next read on
            self._buffered = True
            self.transport.set_protocol(_Reader(self))

    def on_body(self, body: bytes) -> None:
        if self._discarding:
            return
        whole = self._whole
        if whole is None:
            if self._growing and not self.cycle.response_complete:  # else uvicorn drops it
                if not self.budget.fits(len(body)):
                    self._over_budget_growing()
                self._body_bytes += len(body)
                self.budget.used += len(body)
            super().on_body(body)
        elif not self.cycle.response_complete:  # answered without its body: dropped
            end = self._filled + len(body)
            whole[self._filled : end] = body  # the parser stops at the declared length
            self._filled = end

    def on_message_complete(self) -> None:
        self._in_body = False
        self._cancel_body_timer()
        if not self._discarding:
            # The body stays taken from the budget until its response is complete: the
            # handler holds it (or the arrays decoded from it) until then.
            size, self._body_bytes = self._body_bytes, 0
            if self.cycle is None or self.cycle.response_complete:  # answered before its body
                self.budget.used -= size
            else:
                self._held.append(size)
        if self._whole is not None:
            if (
                self._filled < len(self._whole)
                and not self._discarding
                and self.cycle is not None
                and not self.cycle.response_complete  # answered early: the body was dropped
            ):
                # The parser ended the message before the body it declared arrived (it does
                # for an upgrade, refused above): a buffer the kernel has not filled holds
                # earlier requests' memory and must never reach a handler.
                self._answer(
                    400,
                    "bad_request",
                    "the request ended before its declared body",
                    RefusalReason.BAD_HTTP,
                )
            self._whole.release()
            self._whole = None
        if self._discarding:
            self._discarding = False
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )
            return
        super().on_message_complete()
        direct, self._direct = self._direct, None
        cycle = self.cycle
        if direct is not None and cycle is not None and not cycle.response_complete:
            body, cycle.body = cycle.body, bytearray()
            # a memoryview of the buffer the kernel read the body into, or the bytearray
            direct.start(cycle.scope, body, self.tasks)  # type: ignore[arg-type]

    def send_400_response(self, msg: str) -> None:
        if not self._answered:  # a refusal of ours stopped the parser: it already answered
            self.refused(RefusalReason.BAD_HTTP)
            super().send_400_response(msg)

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.limits.max_header_bytes:
            self._answer(
                431,
                "headers_too_large",
                "the request line and headers are over "
                f"max_header_bytes={self.limits.max_header_bytes}",
                RefusalReason.MAX_HEADER_BYTES,
            )

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            try:
                self._answer(
                    408,
                    "request_timeout",
                    "the request head did not arrive within "
                    f"header_timeout_s={self.limits.header_timeout_s:g}",
                    RefusalReason.HEADER_TIMEOUT,
                )
            except _Answered:
                pass

    def _body_late(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        if not self._discarding and self.cycle is not None and not self.cycle.response_started:
            # The handler waiting for the body sees a disconnect; the client sees why.
            self.refused(RefusalReason.BODY_TIMEOUT)
            message = "the request body did not arrive within body_timeout_s={:g}"
            self.transport.write(
                refusal_response(
                    408,
                    "request_timeout",
                    message.format(self.limits.body_timeout_s),
                    retry_after_s=0,
                    close=True,
                )
            )
        self.transport.close()

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _answer(
        self,
        status: int,
        code: str,
        message: str,
        reason: RefusalReason,
        retry_after_s: int = 0,
    ) -> None:
        """Answer, close, and stop the parser."""
        self.refused(reason)
        self._answered = True
        if not self._responding():  # else the answer would land inside an earlier response
            self.transport.write(refusal_response(status, code, message, retry_after_s, close=True))
        self.transport.close()
        raise _Answered()

    def _responding(self) -> bool:
        """An earlier (pipelined) request's response is still being written."""
        return self.cycle is not None and not self.cycle.response_complete

    def _refuse_and_discard(self, status: int, message: str, reason: RefusalReason) -> None:
        """A 503 (or 413) on a connection that stays open; the request's body is skipped,
        within ``body_timeout_s`` like any body (else a client that never sends it held the
        connection for ever: the idle timer is off while a request is read)."""
        self.refused(reason)
        response = refusal_response(
            status, REFUSAL_CODES[status], message, int(status == 503), close=False
        )
        self.transport.write(response)
        self._discarding = True
        self._in_body = True

    def _over_budget(self, declared: int) -> None:
        """Refuse a request whose declared body does not fit the budget, before it is read."""
        limit = self.budget.limit
        reason = RefusalReason.MAX_INFLIGHT_BODY_BYTES
        if declared > limit:  # would never fit: not worth a retry
            message = f"body of {declared} bytes is over max_inflight_body_bytes={limit}"
            status = 413
        else:
            message = (
                f"bodies of {self.budget.used} bytes are in flight: {declared} more would pass "
                f"max_inflight_body_bytes={limit}"
            )
            status = 503
        if self._responding():  # pipelined behind a response being written: closed after it
            self._answer(status, REFUSAL_CODES[status], message, reason, int(status == 503))
        self._refuse_and_discard(status, message, reason)

    def _over_budget_growing(self) -> None:
        """A body of no declared length grew past the budget: 503 (unless its response has
        begun, or one before it is being written) and the connection closed, as for a body
        past its deadline; the handler waiting for the body sees a disconnect."""
        self.refused(RefusalReason.MAX_INFLIGHT_BODY_BYTES)
        self._answered = True
        if not self.cycle.response_started and not self.pipeline:
            message = (
                f"bodies of {self.budget.used} bytes are in flight: this one would pass "
                f"max_inflight_body_bytes={self.budget.limit}"
            )
            self.transport.write(refusal_response(503, "overloaded", message, 1, close=True))
        self.transport.close()
        raise _Answered()


def protocol_class(
    limits: HttpLimits, refused: Callable[[RefusalReason], None] = _uncounted
) -> type[BoundedHttpProtocol]:
    """The protocol class uvicorn instantiates, bound to ``limits``; ``refused`` counts each
    request turned away."""

    class Bound(BoundedHttpProtocol):
        pass

    Bound.limits = limits
    Bound.in_flight = InFlight()
    Bound.budget = BodyBudget(limits.max_inflight_body_bytes)
    Bound.refused = staticmethod(refused)
    Bound.head_buffer = memoryview(bytearray(HEAD_READ_BYTES))
    return Bound
