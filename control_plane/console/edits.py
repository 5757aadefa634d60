"""Changes to what the read-only pages show: a device's operator labels (on its page), and a
model version's stage, validation, optimised variants and the discard of an unfinished push
(on the version's page). Each is the API's own route, called with the operator's token; the
page it came from shows the API's refusal."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import Response

from control_plane.console.forms import one, pairs
from control_plane.console.web import OPERATOR, BadForm, Operator, confirmation, form, redirect

router = APIRouter(prefix="/ui", include_in_schema=False)
STAGES = ("candidate", "production", "retired", "archived")
MAX_SELECTED = 50
"""Devices one label change may tick: a page of the device list."""


def label_change(fields: dict[str, list[str]]) -> dict[str, str | None]:
    """The API's label change from the form: ``set`` (key=value, comma-separated) adds or
    changes labels, ``key=`` or a ``remove`` (a key) removes one, as ``devices label`` does."""
    change: dict[str, str | None] = {
        k: v or None for k, v in pairs(one(fields, "set"), "labels").items()
    }
    for key in (k.strip() for k in fields.get("remove", [])):
        if key:
            change[key] = None
    if not change:
        raise BadForm(400, "labels: give key=value to set, or a label to remove")
    return change


@router.post("/devices/labels")
async def label_selection(request: Request, who: Operator = OPERATOR) -> Response:
    """The same change on each device ticked on a page of the list, one API call each (as
    ``devices label`` is run once a device): one refused stops there, those before it keep
    their change."""
    fields = await form(request, who)
    selected = [d for d in fields.get("device", []) if d]
    if not selected or len(selected) > MAX_SELECTED:
        raise BadForm(400, f"devices: tick 1 to {MAX_SELECTED} devices, not {len(selected)}")
    change = label_change(fields)
    for device_id in selected:
        path = f"/api/v1/devices/{quote(device_id, safe='')}/labels"
        await who.api.call("PATCH", path, json={"labels": change})
    shown = ",".join(f"{k}={v}" for k, v in change.items() if v is not None)
    return redirect(f"/ui/devices?label={quote(shown)}" if shown else "/ui/devices")


@router.post("/devices/{device_id}/labels")
async def set_labels(request: Request, device_id: str, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    path = f"/api/v1/devices/{quote(device_id, safe='')}/labels"
    await who.api.call("PATCH", path, json={"labels": label_change(fields)})
    return redirect(f"/ui/devices/{quote(device_id, safe='')}")


@router.post("/models/{name}/versions/{version}/stage")
async def set_stage(
    request: Request, name: str, version: int, who: Operator = OPERATOR
) -> Response:
    fields = await form(request, who)
    stage = one(fields, "stage")
    if stage not in STAGES:
        raise BadForm(400, f"stage: one of {', '.join(STAGES)}, not {stage!r}")
    here = f"/models/{quote(name, safe='')}/versions/{version}"
    body: dict[str, Any] = {"stage": stage}
    await who.api.call("POST", f"/api/v1{here}/stage", json=body)
    return redirect(f"/ui{here}")


@router.post("/models/{name}/versions/{version}/validate")
async def validate(request: Request, name: str, version: int, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    here = f"/models/{quote(name, safe='')}/versions/{version}"
    await who.api.call("POST", f"/api/v1{here}/validate")
    return redirect(f"/ui{here}")


@router.post("/models/{name}/versions/{version}/optimise")
async def optimise(request: Request, name: str, version: int, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    try:
        drop = float(one(fields, "max_accuracy_drop") or "0.01")
    except ValueError:
        raise BadForm(400, "max_accuracy_drop: a fraction, 0.01 for one point") from None
    here = f"/models/{quote(name, safe='')}/versions/{version}"
    await who.api.call("POST", f"/api/v1{here}/optimise", json={"max_accuracy_drop": drop})
    return redirect(f"/ui{here}")


@router.get("/models/{name}/versions/{version}/confirm/discard")
async def confirm_discard(
    request: Request, name: str, version: int, who: Operator = OPERATOR
) -> Response:
    here = f"/ui/models/{quote(name, safe='')}/versions/{version}"
    return confirmation(
        request,
        who,
        title=f"Discard {name} v{version}?",
        meaning="Its files are missing: the unfinished push goes, and its number is free for "
        "the next push. A complete version cannot be discarded (archive it instead).",
        action=f"{here}/discard",
        back=here,
        button="Discard the push",
    )


@router.post("/models/{name}/versions/{version}/discard")
async def discard(request: Request, name: str, version: int, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    await who.api.call("DELETE", f"/api/v1/models/{quote(name, safe='')}/versions/{version}")
    return redirect("/ui/models")
