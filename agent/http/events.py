"""Server-sent events, and knowing when their client is gone: what every streaming route on the
agent's HTTP server shares (the OpenAI-compatible front end, Triton's generate extension).

NOTE: the framing is the WHATWG HTML spec's ``text/event-stream`` (one ``data:`` line and a
blank line per event), as OpenAI and Triton's ``generate_stream`` use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agent.http.connection import CONNECTION_KEY, Connection


def sse(payload: dict[str, Any]) -> bytes:
    """One event of a JSON object."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def on_client_gone(scope: Scope, receive: Receive, gone: Callable[[], None]) -> Callable[[], None]:
    """Call ``gone`` when the client goes away; return what stops watching.

    Under the agent's protocol the connection calls back (no task per request); under another
    server a task waits for ``http.disconnect`` (the body has been read, so that is the only
    message left)."""
    connection: Connection | None = scope.get(CONNECTION_KEY)
    if connection is not None:
        if connection.lost:
            gone()
            return lambda: None
        connection.on_lost(gone)

        def forget() -> None:
            try:
                connection.forget(gone)
            except ValueError:  # called back already: the callbacks are gone
                pass

        return forget

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone()

    task = asyncio.ensure_future(watch())

    def stop() -> None:
        task.cancel()

    return stop


class EventStream(Response):
    """A ``text/event-stream`` response of the events ``events`` yields; ``cancel`` is called
    as soon as the client goes away, and once more when the response ends (it must be
    idempotent: it ends what produces the events). A :class:`Response`, so that FastAPI hands
    it on as it is."""

    def __init__(self, events: AsyncIterator[bytes], cancel: Callable[[], None]) -> None:
        super().__init__(media_type="text/event-stream")
        self.events = events
        self.cancel = cancel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stop_watching = on_client_gone(scope, receive, self.cancel)
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client is gone mid-write
        finally:
            stop_watching()
            self.cancel()
