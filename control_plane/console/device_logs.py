"""A device's logs and support bundle on its page (operators): the forms that ask for them,
and the download of an answer. Each is the API's own route (``/api/v1/devices/{id}/logs``,
``.../support-bundle``, ``.../diagnostics/{request}/data``) called with the operator's
token; a viewer's page shows none of it, and the API refuses a viewer's download."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import Response

from control_plane.console.forms import one
from control_plane.console.web import OPERATOR, BadForm, Operator, form, redirect

router = APIRouter(prefix="/ui", include_in_schema=False)
SINCE = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "1d": timedelta(days=1), "": None}
LEVELS = ("", "DEBUG", "INFO", "WARNING", "ERROR")


def log_request(fields: dict[str, list[str]]) -> dict[str, Any]:
    """The API's log request from the form: ``since`` (15m, 1h, 1d or all), ``level``,
    ``max_kib``."""
    since, level, max_kib = one(fields, "since"), one(fields, "level"), one(fields, "max_kib")
    if since not in SINCE:
        raise BadForm(400, f"since: one of 15m, 1h, 1d or empty, not {since!r}")
    if level not in LEVELS:
        raise BadForm(400, f"level: one of {', '.join(LEVELS[1:])} or empty, not {level!r}")
    body: dict[str, Any] = {}
    if (ago := SINCE[since]) is not None:
        body["since"] = (datetime.now(UTC) - ago).isoformat()
    if level:
        body["level"] = level
    if max_kib:
        if not max_kib.isdigit() or not 1 <= int(max_kib) <= 4096:
            raise BadForm(400, f"max_kib: a whole number of KiB from 1 to 4096, not {max_kib!r}")
        body["max_bytes"] = int(max_kib) * 1024
    return body


def _device(device_id: str) -> str:
    return quote(device_id, safe="")


@router.post("/devices/{device_id}/logs")
async def ask_logs(request: Request, device_id: str, who: Operator = OPERATOR) -> Response:
    fields = await form(request, who)
    path = f"/api/v1/devices/{_device(device_id)}/logs"
    await who.api.call("POST", path, json=log_request(fields))
    return redirect(f"/ui/devices/{_device(device_id)}#diagnostics-h")


@router.post("/devices/{device_id}/support-bundle")
async def ask_bundle(request: Request, device_id: str, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    await who.api.call("POST", f"/api/v1/devices/{_device(device_id)}/support-bundle", json={})
    return redirect(f"/ui/devices/{_device(device_id)}#diagnostics-h")


@router.get("/devices/{device_id}/diagnostics/{request_id}/data")
async def download(device_id: str, request_id: str, who: Operator = OPERATOR) -> Response:
    base = f"/api/v1/devices/{_device(device_id)}/diagnostics/{quote(request_id, safe='')}"
    doc = await who.api.get(base)
    data = await who.api.content(f"{base}/data")
    logs = doc["kind"] == "logs"
    name = f"{device_id}-{doc['kind']}-{request_id[:8]}.{'jsonl' if logs else 'json'}"
    return Response(
        data,
        media_type="application/x-ndjson" if logs else "application/json",
        headers={"Content-Disposition": f'attachment; filename="{quote(name)}"'},
    )
