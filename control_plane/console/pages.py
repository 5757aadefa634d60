"""The pages that only read: overview, devices, one device, models, one model version."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from control_plane.console import views
from control_plane.console.web import OPERATOR, BadForm, Operator, render
from control_plane.device_view import device_lines

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/")
async def overview(request: Request, who: Operator = OPERATOR) -> Response:
    devices = await who.api.get("/api/v1/devices")
    rollouts = await who.api.get("/api/v1/rollouts", limit=50)
    return render(
        request,
        "overview.html",
        who,
        counts=views.fleet_counts(devices),
        presences=views.PRESENCES,
        rollouts=views.active_rollouts(rollouts),
    )


@router.get("/devices")
async def devices(
    request: Request,
    label: str = "",
    profile: str = "",
    presence: str = "",
    model: str = Query(default="", description="model or model:version"),
    page: int = Query(default=1, ge=1, le=10**6),
    who: Operator = OPERATOR,
) -> Response:
    # label, profile and presence are the API's own filters; the served version is the console's
    labels = [p.strip() for p in label.split(",") if p.strip()]
    if presence and presence not in views.PRESENCES:
        raise BadForm(400, f"state: one of {', '.join(views.PRESENCES)}, not {presence!r}")
    found = await who.api.get(
        "/api/v1/devices",
        label=labels,
        profile=profile,
        presence=presence,
    )
    if model:
        found = [d for d in found if views.serves(d, model)]
    filtered = any((label, profile, presence, model))
    everyone = await who.api.get("/api/v1/devices") if filtered else found
    return render(
        request,
        "devices.html",
        who,
        page=views.page_of(found, page),
        filters={"label": label, "profile": profile, "presence": presence, "model": model},
        presences=views.PRESENCES,
        profiles=sorted({d["hardware_profile"] for d in everyone if d["hardware_profile"]}),
    )


@router.get("/devices/{device_id}")
async def device(request: Request, device_id: str, who: Operator = OPERATOR) -> Response:
    path = f"/api/v1/devices/{quote(device_id, safe='')}"
    doc = await who.api.get(path)
    events = await who.api.get(f"{path}/events", limit=50)
    return render(request, "device.html", who, device=doc, summary=device_lines(doc), events=events)


@router.get("/models")
async def models(request: Request, who: Operator = OPERATOR) -> Response:
    found = await who.api.get("/api/v1/models", archived="true")
    return render(request, "models.html", who, models=found)


@router.get("/models/{name}/versions/{version}")
async def model_version(
    request: Request, name: str, version: int, who: Operator = OPERATOR
) -> Response:
    doc = await who.api.get(f"/api/v1/models/{name}/versions/{version}")
    drift = await who.api.get(f"/api/v1/models/{name}/versions/{version}/drift")
    return render(request, "model_version.html", who, mv=doc, drift=drift)
