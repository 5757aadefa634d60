"""What the routes share: the wired services, authentication, roles, error mapping."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Depends, Path, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.responses import Response

from control_plane.db.session import database_unavailable
from control_plane.errors import ControlPlaneError, Forbidden, Unauthorized
from control_plane.ingest.ingestor import Ingestor
from control_plane.ingest.presence import SilenceRule
from control_plane.metrics import FleetMetrics
from control_plane.mqtt.bus import FleetBus
from control_plane.registry.store import ArtifactStore
from control_plane.rollouts.engine import RolloutEngine
from control_plane.settings import ControlPlaneSettings
from control_plane.signing.keys import KeyRing
from control_plane.tokens import Principal, Role, authenticate

log = logging.getLogger("edgefleet.control_plane.api")

INT32_MAX = 2**31 - 1
"""Versions, ids and indexes are INTEGER columns: a larger number is a 400, not a database
overflow."""
VERSION = Path(ge=1, le=INT32_MAX)
ROW_ID = Path(ge=1, le=INT32_MAX)
INDEX = Path(ge=0, le=INT32_MAX)

STATUS = {
    "not_found": 404,
    "invalid_request": 400,
    "unprocessable": 422,
    "conflict": 409,
    "busy": 409,
    "payload_too_large": 413,
    "unauthorized": 401,
    "forbidden": 403,
}


@dataclass
class Services:
    settings: ControlPlaneSettings
    sessions: async_sessionmaker[AsyncSession]
    store: ArtifactStore
    keys: KeyRing
    bus: FleetBus
    ingestor: Ingestor
    engine: RolloutEngine
    metrics: FleetMetrics
    silence: SilenceRule
    """When a device counts as silent: the API judges presence by the rule ``metrics`` counts by."""
    tracer_provider: Any = None
    """OpenTelemetry's provider (``[tracing] enabled``), which the API's and the rollouts'
    spans share; none with tracing off."""


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


async def session(request: Request) -> AsyncIterator[AsyncSession]:
    """A session per request. Routes that change something commit before they answer (so the
    client's next call sees it); anything not committed is rolled back when the session closes."""
    s = services(request).sessions()
    try:
        yield s
    finally:
        try:
            await s.close()
        except DBAPIError as exc:
            # The answer is decided (and may be on its way): a connection that died under it
            # (the database restarting) is dropped from the pool; failing here would cut the
            # response off mid-way.
            if not database_unavailable(exc):
                raise


def require(role: Role) -> Callable[[Request], Awaitable[Principal]]:
    async def dependency(request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("send 'Authorization: Bearer <token>'")
        async with services(request).sessions() as s:
            principal = await authenticate(s, token.strip())
        if principal is None:
            raise Unauthorized("the token is unknown or revoked")
        if principal.role < role:
            raise Forbidden(
                f"this needs the {role.name.lower()} role; "
                f"the token is {principal.role.name.lower()}"
            )
        return principal

    return dependency


SESSION = Depends(session)
VIEWER = Depends(require(Role.VIEWER))
OPERATOR = Depends(require(Role.OPERATOR))
ADMIN = Depends(require(Role.ADMIN))


def json_response(doc: object, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


async def handle_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, ControlPlaneError):
        status = STATUS.get(exc.code, 400)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        body = orjson.dumps({"error": exc.message, "code": exc.code})
        return Response(body, status_code=status, media_type="application/json", headers=headers)
    if isinstance(exc, DBAPIError) and database_unavailable(exc):
        log.warning(
            "database unavailable",
            extra={"path": request.url.path, "error": str(exc.orig).strip()[:300]},
        )
        body = orjson.dumps(
            {"error": "the database is unavailable; retry shortly", "code": "database_unavailable"}
        )
        return Response(
            body, status_code=503, media_type="application/json", headers={"Retry-After": "1"}
        )
    if isinstance(exc, IntegrityError):
        # a unique key taken between the check and the commit: two requests creating the
        # same version or name at once; the loser is told, as a sequential caller would be
        log.info("conflicting write", extra={"path": request.url.path})
        body = orjson.dumps(
            {"error": "created concurrently by another request; read it back", "code": "conflict"}
        )
        return Response(body, status_code=409, media_type="application/json")
    if isinstance(exc, RequestValidationError):
        return json_response({"error": field_error(exc.errors()), "code": "invalid_request"}, 400)
    raise exc


def field_error(errors: Sequence[Any]) -> str:
    """The first of pydantic's (or FastAPI's) validation errors, as ``field.path: message``."""
    first = errors[0]
    field = ".".join(str(p) for p in first["loc"] if p != "body")
    return f"{field or 'body'}: {first['msg']}"
