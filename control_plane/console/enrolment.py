"""Enrolment pages: claims (create one, its token shown on the answer's page alone; revoke;
uses left) and the devices that presented one (approve or reject those pending). Each change
is the API's own route (``control_plane.api.enrolment``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import Response

from control_plane.console.api import ApiRefused
from control_plane.console.forms import listed, one, pairs, required
from control_plane.console.web import (
    OPERATOR,
    BadForm,
    Operator,
    confirmation,
    form,
    redirect,
    render,
)

router = APIRouter(prefix="/ui", include_in_schema=False)
DAY_S = 86400.0


async def _claims_page(
    request: Request, who: Operator, status: int = 200, **context: Any
) -> Response:
    # the API lists claims to operators only: a viewer is told so, not refused the page
    found = await who.api.get("/api/v1/claims") if who.can_act else None
    context.setdefault("values", {})
    return render(request, "claims.html", who, status, claims=found, **context)


@router.get("/claims")
async def claims(request: Request, who: Operator = OPERATOR) -> Response:
    return await _claims_page(request, who)


def _claim_spec(fields: dict[str, list[str]]) -> dict[str, Any]:
    (name,) = required(fields, "name")
    spec: dict[str, Any] = {
        "name": name,
        "labels": pairs(one(fields, "labels"), "labels"),
        "profiles": listed(fields, "profiles"),
        "require_approval": one(fields, "require_approval") == "on",
    }
    if uses := one(fields, "max_uses"):
        spec["max_uses"] = uses
    if days := one(fields, "ttl_days"):
        try:
            spec["ttl_s"] = float(days) * DAY_S
        except ValueError:
            raise BadForm(400, f"valid for (days): not a number: {days!r}") from None
    return spec


@router.post("/claims")
async def create_claim(request: Request, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    try:
        made = await who.api.call("POST", "/api/v1/claims", json=_claim_spec(fields))
    except (BadForm, ApiRefused) as exc:
        values = {k: v[-1] for k, v in fields.items()}
        return await _claims_page(
            request, who, exc.status, error=f"{exc.status}: {exc.message}", values=values
        )
    # NOTE: rendered, not redirected: the API shows the token in this answer only, so the
    # page that shows it is this one, and a reload (no-store) does not bring it back
    return await _claims_page(request, who, 201, made=made)


@router.get("/claims/{claim_id}/confirm/revoke")
async def confirm_revoke(request: Request, claim_id: str, who: Operator = OPERATOR) -> Response:
    return confirmation(
        request,
        who,
        title=f"Revoke claim {claim_id}?",
        meaning="It enrols no device from now; the devices it enrolled keep their identity.",
        action=f"/ui/claims/{quote(claim_id, safe='')}/revoke",
        back="/ui/claims",
        button="Revoke the claim",
    )


@router.post("/claims/{claim_id}/revoke")
async def revoke(request: Request, claim_id: str, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    await who.api.call("POST", f"/api/v1/claims/{quote(claim_id, safe='')}/revoke")
    return redirect("/ui/claims")


@router.get("/enrolments")
async def enrolments(request: Request, who: Operator = OPERATOR) -> Response:
    found = await who.api.get("/api/v1/enrolments")
    pending = [e for e in found if e["state"] == "pending"]
    decided = [e for e in reversed(found) if e["state"] != "pending"][:50]
    return render(request, "enrolments.html", who, pending=pending, decided=decided)


@router.post("/enrolments/{device_id}/approve")
async def approve(request: Request, device_id: str, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    path = f"/api/v1/enrolments/{quote(device_id, safe='')}/approve"
    await who.api.call("POST", path, json={"reason": ""})
    return redirect("/ui/enrolments")


@router.get("/enrolments/{device_id}/confirm/reject")
async def confirm_reject(request: Request, device_id: str, who: Operator = OPERATOR) -> Response:
    return confirmation(
        request,
        who,
        title=f"Reject device {device_id}?",
        meaning="It gets no identity; one that already enrolled loses its broker user.",
        action=f"/ui/enrolments/{quote(device_id, safe='')}/reject",
        back="/ui/enrolments",
        button="Reject the device",
        reason=True,
    )


@router.post("/enrolments/{device_id}/reject")
async def reject(request: Request, device_id: str, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    path = f"/api/v1/enrolments/{quote(device_id, safe='')}/reject"
    await who.api.call("POST", path, json={"reason": one(fields, "reason")})
    return redirect("/ui/enrolments")
