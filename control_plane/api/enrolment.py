"""Enrolment routes: operators create, list and revoke claims and decide pending devices;
devices exchange a claim for their identity (``POST /api/v1/enrol``: the claim token, not an
API token, is the bearer credential, and an unknown one is refused before the body is read)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from common.protocol.enrolment import ENROL_PATH, EnrolmentRequest, EnrolmentStatus
from control_plane.api import audit
from control_plane.api.body import json_body, json_request, read_bounded
from control_plane.api.deps import OPERATOR, SESSION, VIEWER, Services, field_error, json_response
from control_plane.db.models import Claim
from control_plane.db.states import EnrolmentState, Refusal
from control_plane.enrolment.accounts import make_accounts
from control_plane.enrolment.admission import Admission
from control_plane.enrolment.claims import (
    ClaimSpec,
    EnrolmentRefused,
    claim_doc,
    create_claim,
    list_claims,
)
from control_plane.enrolment.dynsec import DynsecError
from control_plane.enrolment.identity import DevicePasswords
from control_plane.enrolment.service import Enroller, enrolment_doc
from control_plane.errors import Invalid, NotFound
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Enrolment"])

REFUSAL_STATUS = {
    Refusal.UNKNOWN_CLAIM: 401,
    Refusal.DEVICE_KEY_MISMATCH: 409,
    Refusal.DEVICE_EXISTS: 409,
}
"""The HTTP status of a refusal; the others are 403."""
MAX_REQUEST_BYTES = 64 * 1024


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=1000)


NEW_CLAIM = json_body(ClaimSpec, OPERATOR)
DECISION = json_body(Decision, OPERATOR)


def attach(app: FastAPI, svc: Services) -> None:
    """Wire the enroller (its broker accounts from the settings) and mount the routes."""
    settings = svc.settings
    app.state.enroller = Enroller(
        svc.sessions,
        make_accounts(settings.enrolment.accounts, settings, svc.sessions.kw["bind"]),
        topic_prefix=settings.topic_prefix,
        pending_retry_s=settings.enrolment.pending_retry_s,
        claim_check_cache_s=settings.enrolment.claim_check_cache_s,
        max_batch=settings.enrolment.max_batch_devices,
        passwords=DevicePasswords(settings.state_dir / "mqtt"),
    )
    e = settings.enrolment
    app.state.enrol_admission = Admission(
        rate_per_s=e.admit_rate_per_s,
        burst_requests=e.admit_burst_requests,
        max_in_flight_requests=e.max_in_flight_requests,
        max_retry_after_s=e.max_retry_after_s,
    )
    app.include_router(router)


def enroller(request: Request) -> Enroller:
    e: Enroller = request.app.state.enroller
    return e


def _refused(exc: EnrolmentRefused) -> Response:
    status = REFUSAL_STATUS.get(exc.reason, 403)
    code = "unauthorized" if status == 401 else "enrolment_refused"
    doc = {"error": exc.message, "code": code, "reason": exc.reason.value}
    resp = json_response(doc, status)
    if status == 401:
        resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


def _unavailable(message: str) -> Response:
    doc = {"error": message, "code": "unavailable"}
    return Response(
        json.dumps(doc), 503, headers={"Retry-After": "5"}, media_type="application/json"
    )


@router.post(
    ENROL_PATH.removeprefix("/api/v1"),
    summary="A device exchanges its claim token for its broker identity and the trust root",
    openapi_extra=json_request(EnrolmentRequest),
    responses={
        201: {"description": "enrolled"},
        202: {"description": "waiting for approval"},
        429: {"description": "too many enrolling at once: ask again after Retry-After"},
    },
)
async def enrol(request: Request) -> Response:
    admission: Admission = request.app.state.enrol_admission
    retry_after_s = admission.try_enter()  # before anything is read or looked up
    if retry_after_s is not None:
        doc = {"error": "too many devices are enrolling: ask again later", "code": "rate_limited"}
        return Response(
            json.dumps(doc),
            429,
            headers={"Retry-After": str(retry_after_s)},
            media_type="application/json",
        )
    started = time.monotonic()
    try:
        return await _enrol(request)
    finally:
        admission.leave(time.monotonic() - started)


async def _enrol(request: Request) -> Response:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    try:
        if scheme.lower() != "bearer" or not token.strip():
            raise EnrolmentRefused(
                Refusal.UNKNOWN_CLAIM, "send the claim token: 'Authorization: Bearer efc_...'"
            )
        await enroller(request).check_claim(token.strip())  # before the body is read
    except EnrolmentRefused as exc:
        return _refused(exc)
    raw = await read_bounded(request, MAX_REQUEST_BYTES)
    try:
        req = EnrolmentRequest.model_validate(json.loads(raw))
    except (ValueError, RecursionError) as exc:
        errors = exc.errors() if isinstance(exc, ValidationError) else None
        raise Invalid(field_error(errors) if errors else f"body: not JSON ({exc})") from None
    try:
        answer = await enroller(request).enrol(token.strip(), req)
    except EnrolmentRefused as exc:
        return _refused(exc)
    except (DynsecError, OSError) as exc:
        return _unavailable(f"the broker account could not be made: {exc}")
    if answer.status is EnrolmentStatus.PENDING:
        retry = str(int(answer.retry_after_s or 30))
        return Response(
            answer.model_dump_json(),
            202,
            headers={"Retry-After": retry},
            media_type="application/json",
        )
    return Response(answer.model_dump_json(), 201, media_type="application/json")


@router.post(
    "/claims",
    status_code=201,
    summary="Create a claim: its token is shown in this answer only",
    openapi_extra=json_request(ClaimSpec),
)
async def new_claim(
    spec: ClaimSpec = NEW_CLAIM, s: AsyncSession = SESSION, who: Principal = OPERATOR
) -> Response:
    claim, token = await create_claim(s, spec, who.name)
    audit.record(s, who.name, "claim.create", f"claim:{claim.id}", **spec.model_dump())
    await s.commit()
    return json_response({**claim_doc(claim, datetime.now(UTC)), "token": token}, 201)


@router.get("/claims", summary="Claims (no tokens), oldest first")
async def claims(s: AsyncSession = SESSION, _: Principal = OPERATOR) -> Response:
    now = datetime.now(UTC)
    return json_response([claim_doc(c, now) for c in await list_claims(s)])


@router.post("/claims/{claim_id}/revoke", summary="Revoke a claim: it enrols no one from now")
async def revoke_claim(
    claim_id: str, s: AsyncSession = SESSION, who: Principal = OPERATOR
) -> Response:
    claim = await s.get(Claim, claim_id)
    if claim is None:
        raise NotFound(f"no claim {claim_id!r}")
    claim.revoked = True
    audit.record(s, who.name, "claim.revoke", f"claim:{claim_id}")
    await s.commit()
    return json_response(claim_doc(claim, datetime.now(UTC)))


@router.get("/enrolments", summary="Devices that presented a claim (state=pending: to decide)")
async def enrolments(
    request: Request, state: EnrolmentState | None = None, _: Principal = VIEWER
) -> Response:
    return json_response([enrolment_doc(r) for r in await enroller(request).list(state)])


@router.post(
    "/enrolments/{device_id}/{decision}",
    summary="approve a device waiting for approval, or reject one (an enrolled one loses its "
    "broker user)",
    openapi_extra=json_request(Decision),
)
async def decide(
    request: Request,
    device_id: str,
    decision: str,
    body: Decision = DECISION,
    who: Principal = OPERATOR,
) -> Response:
    if decision not in ("approve", "reject"):
        raise NotFound(f"no decision {decision!r}: approve or reject")
    svc: Services = request.app.state.services
    try:
        row = await enroller(request).decide(
            device_id, approve=decision == "approve", user=who.name, reason=body.reason
        )
    except (DynsecError, OSError) as exc:
        return _unavailable(f"rejected, but the broker user could not be deleted: {exc}")
    async with svc.sessions.begin() as s:
        audit.record(
            s, who.name, f"enrolment.{decision}", f"device:{device_id}", reason=body.reason
        )
    return json_response(enrolment_doc(row))
