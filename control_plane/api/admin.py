"""Admin routes: keys, tokens, the audit log."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from control_plane.api import audit
from control_plane.api.body import json_body, json_request
from control_plane.api.deps import ADMIN, SESSION, VIEWER, json_response
from control_plane.db.models import NAME_LENGTH, AuditEntry
from control_plane.db.session import stored_utc
from control_plane.tokens import Principal, Role, create_token

router = APIRouter(prefix="/api/v1", tags=["Administration"])


class TokenCreate(BaseModel):
    name: str = Field(min_length=1, max_length=NAME_LENGTH)
    role: Literal["viewer", "operator", "admin"]


NEW_TOKEN = json_body(TokenCreate, ADMIN)


@router.post(
    "/tokens",
    status_code=201,
    summary="Create an API token (shown once; stored hashed)",
    openapi_extra=json_request(TokenCreate),
)
async def new_token(
    body: TokenCreate = NEW_TOKEN,
    s: AsyncSession = SESSION,
    who: Principal = ADMIN,
) -> Response:
    token = await create_token(s, body.name, Role[body.role.upper()])
    audit.record(s, who.name, "token.create", body.name, role=body.role)
    await s.commit()
    return json_response({"name": body.name, "role": body.role, "token": token}, 201)


@router.get("/keys", summary="The current trust root: public keys, revoked keys, version")
async def keys(request: Request, _: Principal = VIEWER) -> Response:
    trust = await request.app.state.trust.current()
    return json_response(
        {
            "signing_key": request.app.state.services.keys.manifest_key.key_id,
            "trust_root": trust.model_dump(mode="json"),
        }
    )


@router.post(
    "/keys/rotate", summary="New manifest key, announced in trust root N+1 and used from now on"
)
async def rotate(request: Request, s: AsyncSession = SESSION, who: Principal = ADMIN) -> Response:
    key_id = await request.app.state.trust.rotate()
    audit.record(s, who.name, "keys.rotate", key_id)
    await s.commit()
    return json_response({"signing_key": key_id})


@router.post("/keys/{key_id}/revoke", summary="Revoke a manifest key (trust root N+1)")
async def revoke(
    key_id: str, request: Request, s: AsyncSession = SESSION, who: Principal = ADMIN
) -> Response:
    trust = await request.app.state.trust.revoke(key_id)
    audit.record(s, who.name, "keys.revoke", key_id)
    await s.commit()
    return json_response(trust.model_dump(mode="json"))


@router.get("/audit", summary="The audit log, newest first")
async def audit_log(
    limit: int = Query(default=200, ge=1, le=5000), s: AsyncSession = SESSION, _: Principal = ADMIN
) -> Response:
    rows = (
        await s.execute(select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit))
    ).scalars()
    return json_response(
        [
            {
                "time": stored_utc(r.time).isoformat(),
                "actor": r.actor,
                "action": r.action,
                "target": r.target,
                "details": r.details,
            }
            for r in rows
        ]
    )
