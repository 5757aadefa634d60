"""Admission as pure ASGI middleware: API key, rate limit.

Checked in that order before a route runs, so a request that is turned away costs a header
scan and a short JSON answer, never a body read or a decode. Probe paths (``open_paths``)
skip all of it: a kubelet must see the agent live even while clients are refused. The limit
on requests in flight and the deadlines for the head and body are enforced earlier still, in
:mod:`agent.http.protocol`.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agent.api.errors import count_refusal, error_response
from agent.errors import AgentError
from agent.serving.access import ApiKeys, RateLimiter


class Admission:
    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: ApiKeys | None,
        limiter: RateLimiter | None,
        open_paths: tuple[str, ...],
        answers: tuple[tuple[frozenset[str], Callable[[Exception], Response]], ...] = (),
    ) -> None:
        self.app = app
        self.keys = keys
        self.limiter = limiter
        self.open_paths = frozenset(open_paths)
        self.answers = answers
        """(paths, renderer): front ends whose clients read another error shape (the
        OpenAI-compatible one's; not all of ``/v1/``, which TF Serving's routes share)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                self.check(scope)
            except AgentError as exc:
                count_refusal(scope, exc)
                await self.answer(scope["path"], exc)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def answer(self, path: str, exc: Exception) -> Response:
        for paths, render in self.answers:
            if path in paths:
                return render(exc)
        return error_response(exc)

    def check(self, scope: Scope) -> None:
        """Raise the :class:`AgentError` that turns the HTTP request away, if one does."""
        if scope["path"] in self.open_paths:
            return
        client = scope["client"][0] if scope.get("client") else "local"
        if self.keys is not None:
            client = self.keys.client(dict(scope["headers"]))
        if self.limiter is not None:
            self.limiter.take(client)
