"""``GET /v2/edgefleet/config``: the application keys of this device's config twin, for apps
on the device (agent/fleet/twin.py). Only what the operator put under ``app``: never the
agent's settings nor anything secret. An agent that follows no fleet answers no keys."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from agent.http.transport import json_response
from agent.serving.state import ServingState

router = APIRouter(tags=["Configuration"])


@router.get(
    "/v2/edgefleet/config",
    summary="The application keys the fleet set for this device (its config twin's app keys)",
)
async def get_config(request: Request) -> Response:
    state: ServingState = request.app.state.api
    twin = state.fleet.twin if state.fleet is not None else None
    return json_response(
        {"version": twin.version if twin else None, "app": twin.app if twin else {}}
    )
