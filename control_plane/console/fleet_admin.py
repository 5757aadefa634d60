"""The cost rates page (operators replace them, as ``edgefleet costs set-rates`` does) and the
trust root page (admins rotate the manifest key or revoke one, as ``edgefleet keys`` does).
Each change is the API's own route, called with the operator's token."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import Response

from control_plane.console.api import ApiRefused
from control_plane.console.forms import one
from control_plane.console.web import (
    OPERATOR,
    BadForm,
    Operator,
    confirmation,
    form,
    redirect,
    render,
)
from control_plane.tokens import Role

router = APIRouter(prefix="/ui", include_in_schema=False)


def rate_lines(text: str) -> list[dict[str, Any]]:
    """The API's rates from the form's lines: ``default 0.1``, ``profile NAME 0.2``,
    ``label NAME=VALUE 0.9`` (one a line; blank lines and ``#`` comments skipped)."""
    rates: list[dict[str, Any]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        kind, *target, amount = line if len(line) > 1 else (line[0], "")
        try:
            per_hour = float(amount)
        except ValueError:
            raise BadForm(400, f"rates, line {number}: {amount!r} is not a cost per hour") from None
        if kind == "default" and not target:
            rates.append({"per_hour": per_hour})
        elif kind in ("profile", "label") and len(target) == 1:
            rates.append({kind: target[0], "per_hour": per_hour})
        else:
            raise BadForm(
                400,
                f"rates, line {number}: 'default PER_HOUR', 'profile NAME PER_HOUR' or "
                f"'label NAME=VALUE PER_HOUR', not {raw.strip()!r}",
            )
    return rates


def as_lines(rates: list[dict[str, Any]]) -> str:
    out = []
    for r in rates:
        target = (
            f"label {r['label']}"
            if "label" in r
            else f"profile {r['profile']}"
            if "profile" in r
            else "default"
        )
        out.append(f"{target} {r['per_hour']:g}")
    return "\n".join(out)


async def _costs_page(
    request: Request, who: Operator, status: int = 200, error: str = "", text: str | None = None
) -> Response:
    doc = await who.api.get("/api/v1/cost-rates")
    lines = as_lines(doc["rates"]) if text is None else text
    return render(request, "costs.html", who, status, rates=doc["rates"], text=lines, error=error)


@router.get("/costs")
async def costs(request: Request, who: Operator = OPERATOR) -> Response:
    return await _costs_page(request, who)


@router.post("/costs")
async def set_costs(request: Request, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    text = one(fields, "rates")
    try:
        await who.api.call("PUT", "/api/v1/cost-rates", json={"rates": rate_lines(text)})
    except (BadForm, ApiRefused) as exc:  # the API's verdict, on the form with what was typed
        return await _costs_page(request, who, exc.status, f"{exc.status}: {exc.message}", text)
    return redirect("/ui/costs")


@router.get("/keys")
async def keys(request: Request, who: Operator = OPERATOR) -> Response:
    trust = await who.api.get("/api/v1/keys")
    return render(request, "keys.html", who, trust=trust, can_admin=who.role >= Role.ADMIN)


@router.get("/keys/confirm/rotate")
async def confirm_rotate(request: Request, who: Operator = OPERATOR) -> Response:
    return confirmation(
        request,
        who,
        title="Rotate the manifest key?",
        meaning="A new key signs manifests and commands from now on; trust root N+1 announces it "
        "to every device beside the old one, which stays valid until you revoke it.",
        action="/ui/keys/rotate",
        back="/ui/keys",
        button="Rotate the key",
    )


@router.post("/keys/rotate")
async def rotate(request: Request, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    await who.api.call("POST", "/api/v1/keys/rotate")
    return redirect("/ui/keys")


@router.get("/keys/{key_id}/confirm/revoke")
async def confirm_revoke(request: Request, key_id: str, who: Operator = OPERATOR) -> Response:
    here = f"/ui/keys/{quote(key_id, safe='')}"
    return confirmation(
        request,
        who,
        title=f"Revoke key {key_id}?",
        meaning="Devices refuse anything it signed from trust root N+1 on: do it once every "
        "device holds the root that announced the key signing now.",
        action=f"{here}/revoke",
        back="/ui/keys",
        button="Revoke the key",
    )


@router.post("/keys/{key_id}/revoke")
async def revoke(request: Request, key_id: str, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    await who.api.call("POST", f"/api/v1/keys/{quote(key_id, safe='')}/revoke")
    return redirect("/ui/keys")
