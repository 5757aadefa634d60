"""OpenTelemetry server spans of the control plane's HTTP API and console, as pure ASGI
middleware: each request continues the caller's ``traceparent`` (a CLI or a pipeline that
traces itself), is named by its route template (``POST /api/v1/rollouts``), and carries the
HTTP semantic conventions' attributes. The span is the current one while the route runs: a
rollout it creates opens its own span under it (:mod:`control_plane.rollouts.tracing`).
Added only where ``[tracing] enabled`` (:func:`control_plane.app.create_app`); the SDK is
imported only then."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ApiTracing:
    def __init__(self, app: ASGIApp, provider: Any) -> None:
        """``provider``: the control plane's (:class:`~control_plane.rollouts.tracing.
        TracedRollouts` builds it); the lifespan shuts it down, flushing the spans."""
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.app = app
        self.tracer = provider.get_tracer("edgefleet.control_plane")
        self._kind = SpanKind.SERVER
        self._propagator = TraceContextTextMapPropagator()
        self._context, self._in = context, trace.set_span_in_context

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k == b"traceparent"
        }
        parent = self._propagator.extract(carrier) if carrier else None
        method, path = scope["method"], scope["path"]
        span = self.tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=self._kind,
            start_time=time.time_ns(),
            attributes={"http.request.method": method, "url.path": path},
        )
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = self._context.attach(self._in(span, parent))
        try:
            await self.app(scope, receive, send_status)
        finally:
            self._context.detach(token)
            _end(span, scope, status)


def _end(span: Any, scope: Scope, status: int) -> None:
    route = scope.get("route")  # set by the router: the template, not the ids in the path
    template = getattr(route, "path", None)
    if template:
        span.update_name(f"{scope['method']} {template}")
        span.set_attribute("http.route", template)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, str(status)))
    span.end()
