"""JSON request bodies: read only once the caller's token and role are checked, and bounded by
``max_json_body_bytes`` while they are read.

FastAPI reads and parses a body *parameter* whole before it solves any dependency, the token
check included: an unauthenticated 100 MiB body cost 210-250 MB of memory before its 401, and
a body that was not JSON got a 400 instead of a 401. So no route declares one. A JSON route
takes its body from ``json_body(Model, ROLE)``, a dependency whose own dependency is the role
check (FastAPI solves a dependency's dependencies before it runs it), and documents it with
``openapi_extra=json_request(Model)``. Uploads stream their body to the artifact store, which
holds them to ``max_upload_bytes``.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from control_plane.api.deps import field_error, services
from control_plane.errors import Invalid, TooLarge
from control_plane.tokens import Principal

BodyT = TypeVar("BodyT", bound=BaseModel)


def json_body(model: type[BodyT], role: Any) -> Any:
    """The request's body as ``model``, read after ``role`` (``OPERATOR``, ``ADMIN``: the same
    object the route's principal comes from, so the token is looked up once) let it through."""

    async def body(request: Request, _: Principal = role) -> BodyT:
        content_type = request.headers.get("content-type", "application/json")
        media = content_type.partition(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise Invalid(f"body: expected application/json, got {content_type!r}")
        raw = await read_bounded(request, services(request).settings.max_json_body_bytes)
        try:
            # as FastAPI parsed it: Python's json takes Infinity, the models refuse it by name
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise Invalid(f"body: not JSON ({exc})") from None
        try:
            return model.model_validate(doc)
        except ValidationError as exc:
            raise Invalid(field_error(exc.errors())) from None

    return Depends(body)


async def read_bounded(request: Request, limit: int) -> bytes:
    """The whole body, or ``TooLarge`` as soon as it declares or passes ``limit`` bytes. The
    count is of the bytes received, so a chunked body is held to it too (and the HTTP parser
    gives no more than a Content-Length declares); no more than ``limit`` is ever held."""
    over = f"the JSON body is over the limit of {limit} bytes (max_json_body_bytes)"
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(over)  # unread: the server drops the rest once the answer is sent
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge(over)
            chunks.append(chunk)
    except ClientDisconnect:
        raise Invalid("body: the client went away before sending it all") from None
    return b"".join(chunks)


def json_request(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` that documents ``model`` as the route's JSON body, as FastAPI does for
    a body parameter. Its nested models are written in place: a ``$ref`` to the model's own
    ``$defs`` would point into the OpenAPI document, where they are not. (None is recursive.)"""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, list):
            return [inline(item) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref", "")
        if ref.startswith("#/$defs/"):
            rest = {key: inline(value) for key, value in node.items() if key != "$ref"}
            return {**inline(defs[ref.removeprefix("#/$defs/")]), **rest}
        return {key: inline(value) for key, value in node.items()}

    content = {"application/json": {"schema": inline(schema)}}
    return {"requestBody": {"required": True, "content": content}}
