"""Maintenance window pages: the list (open now, next opening), the form that creates one
with a preview of its next openings (the control plane's own cron and time-zone code,
:mod:`control_plane.rollouts.windows`) and the deletion. Each change is the API's route."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from control_plane.console import views
from control_plane.console.api import ApiRefused
from control_plane.console.forms import one, pairs, required
from control_plane.console.web import (
    OPERATOR,
    BadForm,
    Operator,
    confirmation,
    form,
    redirect,
    render,
)
from control_plane.rollouts.windows import Window

router = APIRouter(prefix="/ui", include_in_schema=False)
PREVIEW_OPENINGS = 5
"""Openings the form's preview lists."""


async def _list_page(
    request: Request, who: Operator, status: int = 200, **context: Any
) -> Response:
    found = await who.api.get("/api/v1/maintenance-windows")
    context.setdefault("values", {})
    return render(request, "windows.html", who, status, windows=found, **context)


@router.get("/windows")
async def windows(request: Request, who: Operator = OPERATOR) -> Response:
    return await _list_page(request, who)


@router.get("/windows/preview")
async def preview(
    request: Request,
    cron: str = Query(default="", max_length=128),
    timezone: str = Query(default="UTC", max_length=64),
    duration_s: str = Query(default="3600", max_length=32),
    who: Operator = OPERATOR,
) -> Response:
    """The next openings of a window of this cron, time zone and duration (an htmx part)."""
    try:
        seconds = float(duration_s)
    except ValueError:
        seconds = 0.0  # refused below with the window code's own words on durations
    try:
        window = Window.of("preview", cron, seconds, timezone or "UTC")
    except ValueError as exc:  # a bad cron field, zone or duration: the words of its check
        return render(request, "_window_preview.html", who, error=str(exc), shown=[])
    shown = [
        (start, start.astimezone(window.zone))
        for start in views.openings(window, datetime.now(UTC), PREVIEW_OPENINGS)
    ]
    return render(request, "_window_preview.html", who, shown=shown, duration_s=duration_s)


@router.post("/windows")
async def create(request: Request, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    try:
        name, cron, duration_s = required(fields, "name", "cron", "duration_s")
        spec = {
            "name": name,
            "cron": cron,
            "duration_s": duration_s,
            "timezone": one(fields, "timezone") or "UTC",
            "selector": pairs(one(fields, "selector")),
        }
        await who.api.call("POST", "/api/v1/maintenance-windows", json=spec)
    except (BadForm, ApiRefused) as exc:  # the API's verdict on the values, on the form
        values = {k: v[-1] for k, v in fields.items()}
        return await _list_page(
            request, who, exc.status, error=f"{exc.status}: {exc.message}", values=values
        )
    return redirect("/ui/windows")


@router.get("/windows/{name}/confirm/delete")
async def confirm_delete(request: Request, name: str, who: Operator = OPERATOR) -> Response:
    return confirmation(
        request,
        who,
        title=f"Delete maintenance window {name}?",
        meaning="Its devices no longer wait for it: they may start updates at any time, "
        "unless another window holds them.",
        action=f"/ui/windows/{quote(name, safe='')}/delete",
        back="/ui/windows",
        button="Delete the window",
    )


@router.post("/windows/{name}/delete")
async def delete(request: Request, name: str, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    await who.api.call("DELETE", f"/api/v1/maintenance-windows/{quote(name, safe='')}")
    return redirect("/ui/windows")
