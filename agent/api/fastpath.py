"""The inference routes straight to their handler, past the router and the middleware objects.

Under load the agent's event loop is its bottleneck, and for a small model FastAPI's routing
(matching every route in turn, its exception and exit-stack middleware, the request/response
wrappers) costs more than the inference itself. ``POST /v2/models/{m}[/versions/{v}]/infer``
is recognised here from the path, first of all, and answered by
:func:`agent.api.v2.handle_infer` without a ``Request`` or ``Response`` object: the request
context (:func:`agent.api.context.begin`, the access log) and admission
(:meth:`agent.api.admission.Admission.check`: API keys, rate limit) are called here in turn
rather than as middleware layers each wrapping ``send``, errors are answered as
:mod:`agent.api.errors` answers every route's, and the response is written by
:func:`agent.http.answers.respond` rather than as two ASGI messages. It is still
documented by the FastAPI route that declares it. It skips FastAPI's outer middleware (server
errors, its own body limit: the handler enforces ``max_request_bytes`` itself).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from agent.api import v2
from agent.api.admission import Admission
from agent.api.context import Context, begin, finish
from agent.api.errors import count_refusal, error_parts, log_if_failed
from agent.errors import AgentError, ShuttingDownError
from agent.http.answers import respond, respond_when_drained
from agent.http.connection import CONNECTION_KEY, Connection, DirectApp
from agent.http.transport import decoded_body
from agent.inference.service import InferResponse
from agent.serving.state import ServingState

_ROUTE_KEY = "edgefleet.infer_route"
"""Scope key of the (model, version) :meth:`InferFastPath.takes` found."""


def _error_answer(exc: Exception) -> v2.Answer:
    status, extra, body = error_parts(exc)
    headers = [v2.JSON_TYPE, *((k.lower().encode(), v.encode()) for k, v in extra.items())]
    return status, headers, body


def _framed(
    headers: list[tuple[bytes, bytes]], body: bytes, context: Context
) -> list[tuple[bytes, bytes]]:
    """An answer's headers with its length and the request context's headers."""
    return [*headers, (b"content-length", b"%d" % len(body)), *context.headers]


def infer_route(path: str) -> tuple[str, str | None] | None:
    """(model, version) of a V2 infer path, else None."""
    parts = path.split("/")
    if len(parts) == 5 and parts[:3] == ["", "v2", "models"] and parts[4] == "infer":
        return (parts[3], None) if parts[3] else None
    if (
        len(parts) == 7
        and parts[:3] == ["", "v2", "models"]
        and parts[4] == "versions"
        and parts[6] == "infer"
        and parts[3]
        and parts[5]
    ):
        return parts[3], parts[5]
    return None


class InferFastPath:
    """The outermost app: the infer routes are answered here; everything else goes to ``app``
    (the request context and admission middleware around FastAPI)."""

    def __init__(
        self, app: ASGIApp, state: ServingState, admission: Admission, *, access_log: bool
    ) -> None:
        self.app = app
        self.state = state
        self.admission = admission
        self.access_log = access_log
        self.direct_app: DirectApp = self
        """What the agent's protocol asks to answer infer requests without an ASGI task."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            infer_route(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        context = begin(scope, self.state.tracing)
        status = 500
        try:
            try:
                self.admission.check(scope)
                status, headers, body = await v2.handle_infer(self.state, scope, receive, *route)
            except asyncio.CancelledError:
                # Only the server cancels a handler (a client gone is answered as ClientGone):
                # it stopped waiting for this request at shutdown (shutdown_grace_s). The client
                # hears why, where uvicorn would answer a bare 500. Answered, the request ends
                # here: re-raised, the cancellation reached uvicorn, which logged "Exception in
                # ASGI application" with a traceback for every request cut off, an error an
                # operator reads as a crash. uvicorn does not wait for the tasks it cancels.
                gone = ShuttingDownError("the agent shut down before this request was answered")
                status, headers, body = _error_answer(gone)
                if respond(scope, status, _framed(headers, body, context), body):
                    return
                raise
            except Exception as exc:  # a bug answers 500 with the error body, and is logged
                log_if_failed(scope["path"], exc)
                count_refusal(scope, exc)
                status, headers, body = _error_answer(exc)
            headers = _framed(headers, body, context)
            if not respond(scope, status, headers, body):  # another server runs the app
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
        finally:
            finish(scope, context, status, access_log=self.access_log)

    # -- answered from the connection's callbacks ------------------------------------------

    def takes(self, scope: Scope) -> bool:
        """Whether :meth:`start` answers this request once its body is complete, without an
        ASGI task (:class:`agent.http.protocol.BoundedHttpProtocol` asks)."""
        route = infer_route(scope["path"]) if scope["method"] == "POST" else None
        if route is None:
            return False
        try:
            # A request turned away (no valid API key, over the rate limit, a model not
            # served) is answered by the task path before its body is read, as admission
            # promises: here the whole body would be read first.
            self.admission.check(scope)
            self.state.service.resolve(*route)
        except AgentError:
            return False
        scope[_ROUTE_KEY] = route
        return True

    def start(self, scope: Scope, body: bytes, tasks: set[Any]) -> None:
        """Answer an infer request whose body is complete, called from the connection's
        protocol: decode and queue it now, and write the answer from the result's callback.
        The same work as :meth:`__call__` without a task, its ``receive`` and its awaits per
        request (``cnn``, binary, concurrency 8: the event loop's time per request, and so the
        cores the sessions lose, is what sets the rate there). The answer's future joins
        ``tasks`` (uvicorn's), so that a shutdown waits for it as for a task and cancels it
        at the end of the grace period."""
        context = begin(scope, self.state.tracing)
        route: tuple[str, str | None] = scope[_ROUTE_KEY]  # takes() found it
        try:  # admitted by takes()
            headers = dict(scope["headers"])
            body = decoded_body(body, headers, self.state.settings.max_request_bytes)
            call = v2.start_infer(self.state, scope, headers, body, *route, context.started)
        except Exception as exc:  # a bug answers 500 with the error body, and is logged
            log_if_failed(scope["path"], exc)
            count_refusal(scope, exc)
            self._write(scope, context, _error_answer(exc), tasks)
            return
        connection: Connection = scope[CONNECTION_KEY]
        answer = call.answer
        tasks.add(answer)

        def gone() -> None:
            answer.cancel()

        def done(_: asyncio.Future[InferResponse]) -> None:
            tasks.discard(answer)
            if connection.lost:
                finish(scope, context, 499, access_log=self.access_log)
                return
            connection.forget(gone)
            try:
                if answer.cancelled():  # by the server at the end of the shutdown's grace
                    raise ShuttingDownError("the agent shut down before this request was answered")
                response = call.respond(answer.result())
            except Exception as exc:
                log_if_failed(scope["path"], exc)
                response = _error_answer(exc)
            self._write(scope, context, response, tasks)

        if connection.lost:
            answer.cancel()
        else:
            connection.on_lost(gone)
        answer.add_done_callback(done)

    def _write(self, scope: Scope, context: Context, answer: v2.Answer, tasks: set[Any]) -> None:
        status, headers, body = answer
        framed = _framed(headers, body, context)
        if not respond(scope, status, framed, body):  # the client is not reading yet
            respond_when_drained(scope, status, framed, body, tasks)
        finish(scope, context, status, access_log=self.access_log)
