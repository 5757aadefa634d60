"""Offline bundle route: ``POST /api/v1/bundles`` answers a bundle file
(:mod:`common.protocol.bundle`) of signed manifests and artifacts for one device
(:mod:`control_plane.rollouts.bundles` says what making one records)."""

from __future__ import annotations

import asyncio
import os
import tempfile

from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import FileResponse, Response

from common.protocol.bundle import write_bundle
from control_plane.api import audit
from control_plane.api.body import json_body, json_request
from control_plane.api.deps import OPERATOR, services
from control_plane.rollouts.bundles import BundleSpec, plan_bundle
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Bundles"])
NEW_BUNDLE = json_body(BundleSpec, OPERATOR)


@router.post(
    "/bundles",
    summary="An offline bundle (a tar) of signed manifests and artifacts for one device; "
    "its versions become the device's desired ones",
    openapi_extra=json_request(BundleSpec),
    response_class=FileResponse,
)
async def create_bundle(
    request: Request, spec: BundleSpec = NEW_BUNDLE, who: Principal = OPERATOR
) -> Response:
    svc = services(request)
    settings = svc.settings
    async with svc.sessions.begin() as s:
        device, desired, files = await plan_bundle(
            s,
            spec,
            svc.store,
            sign=svc.keys.sign_message,
            artifact_base_url=settings.artifact_base_url(),
            ttl_s=spec.ttl_s or settings.manifest_ttl_s,
        )
        audit.record(s, who.name, "bundle.create", f"device:{device.id}", **spec.model_dump())
        manifests = list(device.desired.values())
    # retained for the device's next connection: it names what the bundle installs
    svc.bus.publish_desired(device.id, manifests)
    fd, name = tempfile.mkstemp(prefix="bundle-", suffix=".tar")

    def write() -> None:
        with os.fdopen(fd, "wb") as out:
            write_bundle(out, desired, files)

    try:
        await asyncio.to_thread(write)  # artifacts of gigabytes: off the event loop
    except BaseException:
        os.unlink(name)
        raise
    return FileResponse(
        name,
        media_type="application/x-tar",
        filename=f"{device.id}.bundle.tar",
        background=BackgroundTask(os.unlink, name),
    )
