"""Admission as pure ASGI middleware: API key, rate limit, body deadline.

Checked in that order before a route runs, so a request that is turned away costs a header
scan and a short JSON answer, never a body read or a decode. Probe paths (``open_paths``)
skip all of it: a kubelet must see the agent live even while clients are refused. The limit
on requests in flight is enforced earlier still, in :mod:`agent.api.http_protocol`.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.api.access import ApiKeys, RateLimiter
from agent.api.errors import error_response
from agent.errors import AgentError, RequestTimeoutError


class Admission:
    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: ApiKeys | None,
        limiter: RateLimiter | None,
        open_paths: tuple[str, ...],
        body_timeout_s: float,
    ) -> None:
        self.app = app
        self.keys = keys
        self.limiter = limiter
        self.open_paths = frozenset(open_paths)
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        try:
            self._admit(scope)
        except AgentError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self.app(scope, _with_deadline(receive, self.body_timeout_s), send)

    def _admit(self, scope: Scope) -> None:
        client = scope["client"][0] if scope.get("client") else "local"
        if self.keys is not None:
            client = self.keys.client(dict(scope["headers"]))
        if self.limiter is not None:
            self.limiter.take(client)


def _with_deadline(receive: Receive, timeout_s: float) -> Receive:
    """``receive`` that raises :class:`RequestTimeoutError` once the body is late.

    The deadline covers the body only: after its last chunk, receive waits freely (the routes
    wait on it for a disconnect while the model runs).
    """
    deadline = time.monotonic() + timeout_s
    body_done = False

    async def receive_body() -> Message:
        nonlocal body_done
        if body_done:
            return await receive()
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                message = await receive()
        except TimeoutError:
            raise RequestTimeoutError(
                f"the request body did not arrive within body_timeout_s={timeout_s:g}"
            ) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_done = True
        return message

    return receive_body
