"""Per-request context as pure ASGI middleware: request id, W3C trace context, access log.

Pure ASGI rather than ``BaseHTTPMiddleware``, which wraps every response in extra tasks and
breaks disconnect detection. The infer fast path (:mod:`agent.api.fastpath`) runs before this
middleware and uses :func:`begin` and :func:`finish` itself.
"""

from __future__ import annotations

import logging
import random
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:  # the OpenTelemetry SDK is imported only where tracing is on
    from agent.tracing import RequestSpan, Tracing

log = logging.getLogger("edgefleet.agent.access")
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass(slots=True)
class Context:
    started: float
    request_id: str
    trace_id: str
    headers: list[tuple[bytes, bytes]]
    """What every response of the request carries: ``x-request-id`` and ``traceparent``."""
    span: RequestSpan | None = None
    """The request's OpenTelemetry span, where tracing is on."""


def begin(scope: Scope, tracing: Tracing | None = None) -> Context:
    """The request's id and trace context, also left in ``scope["state"]`` for its handler;
    with ``tracing``, its server span (whose id the response's ``traceparent`` names)."""
    started = time.monotonic()
    request_id = traceparent_in = ""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            request_id = value.decode("latin-1")
        elif name == b"traceparent":
            traceparent_in = value.decode("latin-1")
    if not (request_id and _REQUEST_ID.match(request_id)):
        request_id = f"{random.getrandbits(128):032x}"
    match = _TRACEPARENT.match(traceparent_in) if traceparent_in else None
    span = None
    if tracing is not None:
        method, path = scope["method"], scope["path"]
        attributes = {"http.request.method": method, "url.path": path}
        span = tracing.start(f"{method} {path}", traceparent_in if match else None, attributes)
        trace_id, traceparent = span.trace_id, span.traceparent
    else:
        # We are a new span in the caller's trace (or the root of a new one).
        trace_id = match.group(1) if match else f"{random.getrandbits(128):032x}"
        flags = match.group(3) if match else "01"
        # W3C trace ids need to be unique, not secret: the fast generator, not os.urandom
        traceparent = f"00-{trace_id}-{random.getrandbits(64):016x}-{flags}"
    state: dict[str, Any] = scope.setdefault("state", {})
    state.update(
        request_id=request_id, trace_id=trace_id, parent_span=match.group(2) if match else None
    )
    headers = [(b"x-request-id", request_id.encode()), (b"traceparent", traceparent.encode())]
    return Context(started, request_id, trace_id, headers, span)


def finish(scope: Scope, context: Context, status: int, *, access_log: bool) -> None:
    """The access log line. Failures are logged even without the access log, but not 503s:
    under overload a line per refused request would spend the time the refusal saved."""
    state = scope["state"]
    if context.span is not None:
        _end_span(context.span, state, context.request_id, status)
    if not access_log and (status < 500 or status == 503):
        return
    log.log(
        logging.WARNING if status >= 500 else logging.INFO,
        "request",
        extra={
            "request_id": context.request_id,
            "trace_id": context.trace_id,
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "model": state.get("model"),
            "version": state.get("version"),
            "duration_ms": round(1000 * (time.monotonic() - context.started), 3),
            "queue_ms": state.get("queue_ms"),
            "compute_ms": state.get("compute_ms"),
        },
    )


def _end_span(span: RequestSpan, state: dict[str, Any], request_id: str, status: int) -> None:
    model = state.get("model")
    if model is not None:  # routed to a model: what it ran on, and the batcher's times
        version = state.get("version")
        span.served(model, str(version), state.get("placement"), state.get("timing"))
    attributes = {"http.response.status_code": status, "edgefleet.request_id": request_id}
    span.end(attributes, error=str(status) if status >= 500 else None)


class RequestContext:
    def __init__(self, app: ASGIApp, *, access_log: bool, tracing: Tracing | None = None) -> None:
        self.app = app
        self.access_log = access_log
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        context = begin(scope, self.tracing)
        status = 500

        async def send_with_context(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), *context.headers]
            await send(message)

        try:
            await self.app(scope, receive, send_with_context)
        finally:
            finish(scope, context, status, access_log=self.access_log)
