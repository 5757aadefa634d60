"""The pages that only read: overview, devices, one device, models, one model version."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from control_plane.console import views
from control_plane.console.api import ApiRefused
from control_plane.console.web import OPERATOR, BadForm, Operator, refresh_s, render
from control_plane.device_view import device_lines

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/")
async def overview(request: Request, who: Operator = OPERATOR) -> Response:
    summary = await who.api.get("/api/v1/devices/summary")  # counted by the database
    rollouts = await who.api.get("/api/v1/rollouts", limit=50)
    counts = views.fleet_counts(summary)
    served = [(m, v) for m, versions in counts.versions.items() for v in versions]
    drifts = [d for m, v in served if (d := await _registered(who, m, v, "drift")) is not None]
    accuracies = [
        a for m, v in served if (a := await _registered(who, m, v, "accuracy")) is not None
    ]
    return render(
        request,
        "overview.html",
        who,
        counts=counts,
        presences=views.PRESENCES,
        rollouts=views.active_rollouts(rollouts),
        alerts=views.attention(counts, rollouts, drifts, datetime.now(UTC), accuracies),
    )


async def _registered(who: Operator, model: str, version: int, what: str) -> dict[str, Any] | None:
    """A served version's ``drift`` or ``accuracy`` document, or None for one the registry
    does not hold (a version a device brought with it, never pushed)."""
    try:
        doc: dict[str, Any] = await who.api.get(
            f"/api/v1/models/{quote(model, safe='')}/versions/{version}/{what}"
        )
    except ApiRefused as exc:
        if exc.status != 404:
            raise
        return None
    return doc | {"model": model, "version": version}


@router.get("/devices")
async def devices(
    request: Request,
    label: str = "",
    profile: str = "",
    presence: str = "",
    model: str = Query(default="", description="model or model:version"),
    agent: str = Query(default="", description="degraded or rolled_back"),
    after: str = Query(default="", max_length=128, description="the API's cursor"),
    page: int = Query(default=1, ge=1, le=10**6, description="the page's number, as shown"),
    who: Operator = OPERATOR,
) -> Response:
    # every filter is the API's, and so is the paging: a page reads a page of devices
    labels = [p.strip() for p in label.split(",") if p.strip()]
    if presence and presence not in views.PRESENCES:
        raise BadForm(400, f"state: one of {', '.join(views.PRESENCES)}, not {presence!r}")
    try:
        served, number = views.model_filter(model) if model else ("", None)
    except ValueError as exc:
        raise BadForm(400, str(exc)) from exc
    version = None if number is None else str(number)  # "0" too: the client drops falsy values
    if agent and agent not in views.AGENT_STATES:
        raise BadForm(400, f"agent: one of {', '.join(views.AGENT_STATES)}, not {agent!r}")
    filters = {
        "label": labels,
        "profile": profile,
        "presence": presence,
        "model": served,
        "agent": agent,
    }
    found, next_after = await who.api.page(
        "/api/v1/devices",
        **filters,
        model_version=version,
        limit=views.PAGE_SIZE,
        after=after,
    )
    matching = await who.api.get("/api/v1/devices/summary", **filters, model_version=version)
    filtered = any((label, profile, presence, model, agent))
    everyone = await who.api.get("/api/v1/devices/summary") if filtered else matching
    return render(
        request,
        "devices.html",
        who,
        page=views.Page(
            found,
            page if after else 1,
            sum(r["devices"] for r in matching["presence"]),
            next_after,
        ),
        filters={
            "label": label,
            "profile": profile,
            "presence": presence,
            "model": model,
            "agent": agent,
        },
        presences=views.PRESENCES,
        profiles=sorted({r["hardware_profile"] for r in everyone["presence"]} - {None}),
    )


@router.get("/devices/{device_id}")
async def device(request: Request, device_id: str, who: Operator = OPERATOR) -> Response:
    path = f"/api/v1/devices/{quote(device_id, safe='')}"
    doc = await who.api.get(path)
    events = await who.api.get(f"{path}/events", limit=50)
    # logs and bundles are an operator's: a viewer's page neither lists nor asks for them
    asked = (await who.api.get(f"{path}/diagnostics"))["requests"] if who.can_act else []
    return render(
        request,
        "device.html",
        who,
        device=doc,
        diagnostics=asked,
        summary=device_lines(doc),
        history=views.history_rows(events),
        refresh_s=refresh_s(request),
    )


@router.get("/devices/{device_id}/presence")
async def presence(request: Request, device_id: str, who: Operator = OPERATOR) -> Response:
    """A device's presence and last contact, re-read by its open page (an htmx part)."""
    doc = await who.api.get(f"/api/v1/devices/{quote(device_id, safe='')}")
    return render(request, "_presence.html", who, device=doc, refresh_s=refresh_s(request))


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
    cost = await who.api.get(f"/api/v1/models/{name}/versions/{version}/cost")
    accuracy = await who.api.get(f"/api/v1/models/{name}/versions/{version}/accuracy")
    return render(
        request, "model_version.html", who, mv=doc, drift=drift, cost=cost, accuracy=accuracy
    )
