"""Config twin routes: set and unset keys of a device's or a label group's twin, list the
twins, and show one device's desired twin against what it reports (:mod:`control_plane.twins`).

A setting's name is passed through unchecked beyond its form: which settings exist, and
which apply live, is the agent's to say (it reports a key it does not take as rejected).
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from common.protocol.signing import canonical_bytes
from common.protocol.topics import valid_device_id
from common.protocol.twin import KEY_PATTERN, MAX_APP_BYTES
from control_plane.api import audit
from control_plane.api.body import json_body, json_request
from control_plane.api.deps import (
    OPERATOR,
    SESSION,
    VIEWER,
    Services,
    json_response,
    services,
)
from control_plane.db.models import ConfigTwinRow, Device
from control_plane.errors import Invalid, NotFound
from control_plane.tokens import Principal
from control_plane.twins.documents import sync, target_of, twin_view

router = APIRouter(prefix="/api/v1", tags=["Config twins"])
APP_KEY = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
LABEL = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$"


class TwinChange(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    device: str | None = Field(default=None, max_length=128)
    """The device's own twin (wins over its groups', key by key)..."""
    selector: dict[str, str] = Field(default_factory=dict, max_length=16)
    """...or a label group's: every device whose labels match all of these."""
    set: dict[str, Any] = Field(default_factory=dict, max_length=64)
    """Settings by name (``telemetry_interval_s``), application keys as ``app.<key>``."""
    unset: list[str] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _target(self) -> TwinChange:
        if (self.device is None) == (not self.selector):
            raise ValueError("give device or selector, one of them")
        if self.device is not None and not valid_device_id(self.device):
            raise ValueError(f"device: invalid device id {self.device!r}")
        for key, value in self.selector.items():
            if not re.match(LABEL, key) or len(value) > 63:
                raise ValueError(f"selector: invalid label {key}={value!r}")
        for key in [*self.set, *self.unset]:
            name = key.removeprefix("app.")
            if not re.match(APP_KEY if key.startswith("app.") else KEY_PATTERN, name):
                raise ValueError(
                    f"set: invalid key {key!r} (a setting name, or app.<key> for an app key)"
                )
        return self


CHANGE = json_body(TwinChange, OPERATOR)
log = logging.getLogger("edgefleet.control_plane.twins")


def attach(app: FastAPI, svc: Services) -> None:
    """Mount the routes, and resolve a device's twin again when it comes online: a device new
    to the fleet, or back with other labels, gets its groups' twin."""

    async def on_device_online(device_id: str) -> None:
        try:
            async with svc.sessions() as s:
                changed = await sync(s, svc.keys, only=[device_id])
                published = [(d.id, list(d.desired.values())) for d in changed]
                await s.commit()
        except Exception:  # the database away: the next twin change or connect signs it
            log.exception("config twin not resolved", extra={"device": device_id})
            return
        for device, manifests in published:
            svc.bus.publish_desired(device, manifests)

    svc.ingestor.on_device_online.append(on_device_online)
    app.include_router(router)


def row_doc(row: ConfigTwinRow) -> dict[str, Any]:
    return {
        "target": row.target,
        "device": row.device_id,
        "selector": row.selector,
        "settings": row.settings,
        "app": row.app,
        "updated_by": row.updated_by,
        "updated_at": row.updated_at.isoformat(),
    }


@router.put(
    "/twins",
    summary="Set or unset keys of a device's or a label group's config twin",
    openapi_extra=json_request(TwinChange),
)
async def change_twin(
    request: Request,
    change: TwinChange = CHANGE,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    if change.device is not None and await s.get(Device, change.device) is None:
        raise NotFound(f"no device {change.device!r}")
    target = target_of(change.device, change.selector)
    row = (
        await s.execute(select(ConfigTwinRow).where(ConfigTwinRow.target == target))
    ).scalar_one_or_none()
    now = datetime.now(UTC)
    if row is None:
        row = ConfigTwinRow(
            target=target,
            device_id=change.device,
            selector=dict(change.selector),
            settings={},
            app={},
            updated_by=who.name,
            updated_at=now,
        )
        s.add(row)
    settings, app = dict(row.settings), dict(row.app)
    for key in change.unset:
        (app if key.startswith("app.") else settings).pop(key.removeprefix("app."), None)
    for key, value in change.set.items():
        if key.startswith("app."):
            app[key.removeprefix("app.")] = value
        else:
            settings[key] = value
    if len(canonical_bytes(app)) > MAX_APP_BYTES:
        raise Invalid(f"set: application keys exceed {MAX_APP_BYTES} bytes")
    row.settings, row.app, row.updated_by, row.updated_at = settings, app, who.name, now
    await s.flush()
    svc = services(request)
    changed = await sync(s, svc.keys)
    audit.record(s, who.name, "twin.set", target, set=change.set, unset=change.unset)
    published = [(d.id, list(d.desired.values())) for d in changed]
    await s.commit()
    for device_id, manifests in published:
        svc.bus.publish_desired(device_id, manifests)
    return json_response(row_doc(row) | {"signed_for": sorted(d for d, _ in published)})


@router.get("/twins", summary="The config twins, per device and per label group")
async def list_twins(s: AsyncSession = SESSION, _: Principal = VIEWER) -> Response:
    rows = (await s.execute(select(ConfigTwinRow).order_by(ConfigTwinRow.id))).scalars()
    return json_response({"twins": [row_doc(r) for r in rows]})


@router.get(
    "/devices/{device_id}/twin",
    summary="A device's config twin: desired, reported, and the differences",
)
async def device_twin(device_id: str, s: AsyncSession = SESSION, _: Principal = VIEWER) -> Response:
    device = await s.get(Device, device_id)
    if device is None:
        raise NotFound(f"no device {device_id!r}")
    return json_response(twin_view(device))
