"""Per-request context as pure ASGI middleware: request id, W3C trace context, access log.

Pure ASGI rather than ``BaseHTTPMiddleware``, which wraps every response in extra tasks and
breaks disconnect detection.
"""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("edgefleet.agent.access")
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RequestContext:
    def __init__(self, app: ASGIApp, *, access_log: bool) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k in (b"x-request-id", b"traceparent")
        }
        request_id = headers.get("x-request-id", "")
        if not _REQUEST_ID.match(request_id):
            request_id = f"{random.getrandbits(128):032x}"
        match = _TRACEPARENT.match(headers.get("traceparent", ""))
        # We are a new span in the caller's trace (or the root of a new one).
        trace_id = match.group(1) if match else f"{random.getrandbits(128):032x}"
        flags = match.group(3) if match else "01"
        # W3C trace ids need to be unique, not secret: the fast generator, not os.urandom
        traceparent = f"00-{trace_id}-{random.getrandbits(64):016x}-{flags}"
        state: dict[str, Any] = scope.setdefault("state", {})
        state.update(
            request_id=request_id, trace_id=trace_id, parent_span=match.group(2) if match else None
        )
        status = 500

        async def send_with_context(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                    (b"traceparent", traceparent.encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_with_context)
        finally:
            # Failures are logged even without the access log, but not 503s: under overload a
            # line per refused request would spend the time the refusal saved.
            if self.access_log or (status >= 500 and status != 503):
                log.log(
                    logging.WARNING if status >= 500 else logging.INFO,
                    "request",
                    extra={
                        "request_id": request_id,
                        "trace_id": trace_id,
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "model": state.get("model"),
                        "version": state.get("version"),
                        "duration_ms": round(1000 * (time.monotonic() - started), 3),
                        "queue_ms": state.get("queue_ms"),
                        "compute_ms": state.get("compute_ms"),
                    },
                )
