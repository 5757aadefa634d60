"""What the routes on the agent's HTTP server share: bounded body reading, disconnects, JSON."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope

from agent.errors import PayloadTooLargeError, RequestError
from agent.http.connection import CONNECTION_KEY, Connection

T = TypeVar("T")


async def read_body(request: Request, limit: int, setting: str = "max_request_bytes") -> bytes:
    """The request body, refused as soon as it passes ``limit`` bytes (also once inflated);
    ``setting`` names the limit in the error."""
    return await receive_body(request.receive, dict(request.scope["headers"]), limit, setting)


async def receive_body(
    receive: Receive, headers: dict[bytes, bytes], limit: int, setting: str = "max_request_bytes"
) -> bytes:
    """:func:`read_body` from the ASGI ``receive`` and the request's headers (lower-case names)."""
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(
            f"body of {declared.decode()} bytes is over the limit of {limit} bytes ({setting})"
        )
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"body is over the limit of {limit} bytes ({setting})")
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    # one chunk (a body collected whole, agent.http.protocol) is taken as it is: a join
    # would copy it
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return decoded_body(body, headers, limit, setting)


def decoded_body(
    body: bytes, headers: dict[bytes, bytes], limit: int, setting: str = "max_request_bytes"
) -> bytes:
    """A whole body as its ``Content-Encoding`` says, inflated within ``limit`` bytes."""
    named = headers.get(b"content-encoding")
    if named is None:
        return body
    encoding = named.decode("latin-1").lower()
    if encoding in ("gzip", "deflate"):
        body = _inflate(body, encoding, limit, setting)
    elif encoding != "identity":
        raise RequestError(
            f"Content-Encoding {encoding!r} is not supported (gzip, deflate)",
            field="Content-Encoding",
        )
    return body


def _inflate(body: bytes, encoding: str, limit: int, setting: str) -> bytes:
    # max_length bounds the output, so a small compressed bomb cannot exhaust memory
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise RequestError(
            f"body is not valid {encoding} data: {exc}", field="Content-Encoding"
        ) from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise PayloadTooLargeError(f"inflated body is over the limit of {limit} bytes ({setting})")
    return out


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


async def until_disconnect(scope: Scope, receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work``, but cancel it if the client disconnects first.

    A cancelled inference is dropped from its batcher's queue if it has not run yet. Under the
    agent's own protocol the connection calls back when it is lost; elsewhere (another server
    running the app) a watcher task waits for ``http.disconnect``.
    """
    connection: Connection | None = scope.get(CONNECTION_KEY)
    if connection is None:
        return await _watching(receive, work)
    if connection.lost:
        work.close()
        raise ClientGone()
    task = asyncio.current_task()
    assert task is not None
    gone = False

    def cancel() -> None:
        nonlocal gone
        gone = True
        task.cancel()

    connection.on_lost(cancel)
    try:
        result = await work
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:  # ours alone, not a shutdown's
            raise ClientGone() from None
        raise
    finally:
        if not gone:
            connection.forget(cancel)
    if gone:  # the work swallowed the cancellation
        task.uncancel()
        raise ClientGone()
    return result


async def _watching(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone()


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def request_context(scope: Scope) -> dict[str, Any]:
    """The request's fields for the access log (:mod:`agent.api.context`): the dict behind
    ``request.state``, without the wrapper object ``request.state`` makes per request."""
    context: dict[str, Any] = scope.setdefault("state", {})
    return context


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


def server_timing(queue_s: float, compute_s: float, total_s: float) -> str:
    """A ``Server-Timing`` header value, in milliseconds."""
    return (
        f"queue;dur={queue_s * 1000:.3f}, compute;dur={compute_s * 1000:.3f}, "
        f"total;dur={total_s * 1000:.3f}"
    )
