"""A device's logs and support bundle (operator: logs can say more than a viewer should
read): ``POST /api/v1/devices/{id}/logs`` and ``.../support-bundle`` send the device a
signed request; ``GET .../diagnostics/{request}`` tells its state (pending, uploading k of n
bytes, complete, failed and why) and ``.../data`` hands the answer over
(docs/operations.md, "Seeing a device's logs")."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from common.protocol.diagnostics import DEFAULT_LOG_BYTES, MAX_DIAGNOSTIC_BYTES, LogLevel
from common.protocol.messages import Command, CommandType
from control_plane.api import audit
from control_plane.api.body import json_body, json_request
from control_plane.api.deps import OPERATOR, SESSION, Services, json_response, services
from control_plane.db.models import Device, DeviceDiagnostic
from control_plane.db.session import stored_utc
from control_plane.errors import Conflict, NotFound
from control_plane.ingest.diagnostics import DiagnosticReceiver
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Fleet"])
LISTED = 20


class LogRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: AwareDatetime | None = None
    """The oldest line's time (None: as far back as the device keeps)."""
    until: AwareDatetime | None = None
    level: LogLevel | None = None
    """The least severe level sent (None: all)."""
    max_bytes: int = Field(default=DEFAULT_LOG_BYTES, ge=1, le=MAX_DIAGNOSTIC_BYTES)
    """The newest lines that fit this many bytes."""
    ttl_s: float = Field(default=3600, ge=10, le=7 * 24 * 3600)
    """How long the signed request stays valid (an offline device runs it on its return)."""


class BundleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_bytes: int = Field(default=MAX_DIAGNOSTIC_BYTES, ge=1024, le=MAX_DIAGNOSTIC_BYTES)
    """The bundle's size cap: the log lines it carries are cut to fit."""
    ttl_s: float = Field(default=3600, ge=10, le=7 * 24 * 3600)


LOGS_BODY = json_body(LogRequest, OPERATOR)
BUNDLE_BODY = json_body(BundleRequest, OPERATOR)


def attach(app: FastAPI, svc: Services) -> None:
    """Create the receiver (run by the app's lifespan), feed it from ingest, mount the routes."""
    receiver = DiagnosticReceiver(svc.sessions, svc.bus.publish_ack)
    svc.ingestor.on_diagnostic = receiver.offer
    app.state.diagnostics = receiver
    app.include_router(router)


def diagnostic_doc(r: DeviceDiagnostic) -> dict[str, Any]:
    """A request as the API shows it; one still pending past its validity is failed (the
    device was away all that while, or restarted before it answered)."""
    state, error = r.state, r.error
    if state == "pending" and stored_utc(r.expires_at) < datetime.now(UTC):
        state, error = "failed", "expired before the device answered (ask again)"
    return {
        "id": r.id,
        "device_id": r.device_id,
        "kind": r.kind,
        "params": r.params,
        "requested_by": r.requested_by,
        "requested_at": stored_utc(r.requested_at).isoformat(),
        "expires_at": stored_utc(r.expires_at).isoformat(),
        "state": state,
        "received_bytes": r.received_bytes,
        "total_bytes": r.total_bytes,
        "error": error,
        "completed_at": stored_utc(r.completed_at).isoformat() if r.completed_at else None,
    }


async def request_diagnostic(
    s: AsyncSession,
    svc: Services,
    device_id: str,
    who: str,
    kind: CommandType,
    params: dict[str, Any],
    ttl_s: float,
) -> DeviceDiagnostic:
    """Store the request, then send the device its signed command."""
    if await s.get(Device, device_id) is None:
        raise NotFound(f"no device {device_id!r}")
    now = datetime.now(UTC)
    command = Command(
        command_id=uuid.uuid4().hex,
        device_id=device_id,
        type=kind,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
        since=params.get("since"),
        until=params.get("until"),
        min_level=params.get("level"),
        max_bytes=params["max_bytes"],
    )
    row = DeviceDiagnostic(
        id=command.command_id,
        device_id=device_id,
        kind=kind.value,
        params={k: v.isoformat() if isinstance(v, datetime) else v for k, v in params.items()},
        requested_by=who,
        requested_at=now,
        expires_at=command.expires_at,
        state="pending",
        received_bytes=0,
        data=b"",
    )
    s.add(row)
    audit.record(s, who, f"device.{kind.value}", device_id, request_id=row.id, **row.params)
    await s.commit()
    svc.bus.publish_command(device_id, svc.keys.sign_message(command))
    return row


@router.post(
    "/devices/{device_id}/logs",
    summary="Ask a device for its recent log lines (a signed request; the answer is uploaded)",
    openapi_extra=json_request(LogRequest),
)
async def request_logs(
    request: Request,
    device_id: str,
    body: LogRequest = LOGS_BODY,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    params = body.model_dump(exclude={"ttl_s"}, exclude_none=True)
    row = await request_diagnostic(
        s, services(request), device_id, who.name, CommandType.LOGS, params, body.ttl_s
    )
    return json_response(diagnostic_doc(row), 202)


@router.post(
    "/devices/{device_id}/support-bundle",
    summary="Ask a device for a support bundle: redacted config, versions, events, metrics",
    openapi_extra=json_request(BundleRequest),
)
async def request_bundle(
    request: Request,
    device_id: str,
    body: BundleRequest = BUNDLE_BODY,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    params = {"max_bytes": body.max_bytes}
    row = await request_diagnostic(
        s, services(request), device_id, who.name, CommandType.SUPPORT_BUNDLE, params, body.ttl_s
    )
    return json_response(diagnostic_doc(row), 202)


@router.get("/devices/{device_id}/diagnostics", summary="A device's recent log and bundle requests")
async def list_diagnostics(
    device_id: str, s: AsyncSession = SESSION, _: Principal = OPERATOR
) -> Response:
    columns = [c for c in DeviceDiagnostic.__table__.columns if c.name != "data"]
    rows = (
        await s.execute(
            select(*columns)
            .where(DeviceDiagnostic.device_id == device_id)
            .order_by(DeviceDiagnostic.requested_at.desc())
            .limit(LISTED)
        )
    ).all()
    docs = [diagnostic_doc(DeviceDiagnostic(**row._asdict())) for row in rows]
    return json_response({"device_id": device_id, "requests": docs})


async def _row(s: AsyncSession, device_id: str, request_id: str) -> DeviceDiagnostic:
    row = await s.get(DeviceDiagnostic, request_id)
    if row is None or row.device_id != device_id:
        raise NotFound(f"device {device_id!r} has no request {request_id!r}")
    return row


@router.get(
    "/devices/{device_id}/diagnostics/{request_id}",
    summary="A log or bundle request's state: pending, uploading, complete or failed",
)
async def get_diagnostic(
    device_id: str, request_id: str, s: AsyncSession = SESSION, _: Principal = OPERATOR
) -> Response:
    return json_response(diagnostic_doc(await _row(s, device_id, request_id)))


@router.get(
    "/devices/{device_id}/diagnostics/{request_id}/data",
    summary="The answer: JSON lines (logs) or one JSON document (support bundle)",
)
async def get_diagnostic_data(
    device_id: str, request_id: str, s: AsyncSession = SESSION, _: Principal = OPERATOR
) -> Response:
    row = await _row(s, device_id, request_id)
    if row.state != "complete":
        raise Conflict(f"request {request_id} is {row.state}, not complete")
    media = "application/x-ndjson" if row.kind == CommandType.LOGS else "application/json"
    return Response(bytes(row.data), media_type=media)
