"""Maintenance window routes: create, list (open now, next opening) and delete the windows
that say when the devices of a label selector may start updates
(:mod:`control_plane.rollouts.windows`, which the rollout engine applies to every rollout,
a deployment's included)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from control_plane.api import audit
from control_plane.api.body import json_body, json_request
from control_plane.api.deps import OPERATOR, SESSION, VIEWER, json_response
from control_plane.db.models import NAME_LENGTH, MaintenanceWindow
from control_plane.errors import Conflict, NotFound
from control_plane.rollouts.windows import MAX_DURATION_S, Window, window_of
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Deployments"])


class WindowSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=NAME_LENGTH)
    selector: dict[str, str] = Field(default_factory=dict)
    """The devices it holds to its openings (every label given must match; empty: all)."""
    cron: str = Field(max_length=128)
    """When it opens: minute hour day-of-month month day-of-week, in ``timezone``."""
    duration_s: float = Field(gt=0, le=MAX_DURATION_S)
    timezone: str = Field(default="UTC", max_length=64)
    """An IANA name (Europe/Paris): daylight saving is followed."""

    @model_validator(mode="after")
    def _parses(self) -> WindowSpec:
        Window.of(self.name, self.cron, self.duration_s, self.timezone)  # ValueError: a 400
        return self


NEW_WINDOW = json_body(WindowSpec, OPERATOR)


def window_doc(row: MaintenanceWindow, now: datetime) -> dict[str, Any]:
    window = window_of(row)
    opens = window.next_start(now)
    return {
        "name": row.name,
        "selector": row.selector,
        "cron": row.cron,
        "duration_s": row.duration_s,
        "timezone": row.timezone,
        "open_now": window.is_open(now),
        "next_open": opens.isoformat() if opens else None,
    }


@router.post(
    "/maintenance-windows",
    status_code=201,
    summary="Hold the devices of a selector to a window for starting updates",
    openapi_extra=json_request(WindowSpec),
)
async def create_window(
    spec: WindowSpec = NEW_WINDOW, s: AsyncSession = SESSION, who: Principal = OPERATOR
) -> Response:
    taken = select(MaintenanceWindow.id).where(MaintenanceWindow.name == spec.name)
    if (await s.execute(taken)).first():
        raise Conflict(f"maintenance window {spec.name!r} exists; delete it first")
    now = datetime.now(UTC)
    row = MaintenanceWindow(**spec.model_dump(), created_by=who.name, created_at=now)
    s.add(row)
    audit.record(s, who.name, "window.create", f"window:{spec.name}", **spec.model_dump())
    await s.commit()
    return json_response(window_doc(row, now), 201)


@router.get("/maintenance-windows", summary="Maintenance windows: open now, next opening")
async def list_windows(s: AsyncSession = SESSION, _: Principal = VIEWER) -> Response:
    now = datetime.now(UTC)
    rows = (await s.execute(select(MaintenanceWindow).order_by(MaintenanceWindow.name))).scalars()
    return json_response([window_doc(r, now) for r in rows])


@router.delete("/maintenance-windows/{name}", summary="Delete a maintenance window")
async def delete_window(
    name: str, s: AsyncSession = SESSION, who: Principal = OPERATOR
) -> Response:
    row = (
        await s.execute(select(MaintenanceWindow).where(MaintenanceWindow.name == name))
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"no maintenance window {name!r}")
    await s.delete(row)
    audit.record(s, who.name, "window.delete", f"window:{name}")
    await s.commit()
    return Response(status_code=204)
