"""The drift monitor wired into the app, and its route:
``GET /api/v1/models/{name}/versions/{version}/drift`` (viewer)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from control_plane.api.deps import SESSION, VERSION, VIEWER, Services, json_response, services
from control_plane.db.models import InputDrift
from control_plane.db.session import stored_utc
from control_plane.quality.drift_monitor import FLEET, DriftMonitor
from control_plane.registry.store import get_version
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Model registry"])


def attach(app: FastAPI, svc: Services) -> None:
    """Create the monitor (run by the app's lifespan), feed it from ingest, mount the route."""
    monitor = DriftMonitor(svc.sessions, svc.store, svc.metrics, svc.settings.drift)
    if svc.settings.drift.enabled:
        svc.ingestor.on_sketches.append(monitor.offer)
    app.state.drift = monitor
    app.include_router(router)


def drift_doc(row: InputDrift, threshold: float) -> dict[str, object]:
    return {
        "device_id": row.device_id,
        "computed_at": stored_utc(row.computed_at).isoformat(),
        "rows": round(row.rows, 1),
        "windows": row.windows,
        "psi": row.psi,
        "ks": row.ks,
        "wasserstein": row.wasserstein,
        "feature": row.feature,
        "over_threshold": row.psi > threshold,
        "features": row.features,
    }


@router.get(
    "/models/{name}/versions/{version}/drift",
    summary="Input drift against the version's reference set: the fleet's and each device's",
)
async def show_drift(
    request: Request,
    name: str,
    version: int = VERSION,
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    mv = await get_version(s, name, version)  # 404 for an unknown version
    threshold = services(request).settings.drift.psi_threshold
    rows = (
        await s.execute(
            select(InputDrift)
            .where(InputDrift.model == name, InputDrift.version == version)
            .order_by(InputDrift.psi.desc(), InputDrift.device_id)
        )
    ).scalars()
    docs = [drift_doc(r, threshold) for r in rows]
    return json_response(
        {
            "model": name,
            "version": version,
            "reference": (mv.reference or {}).get("sha256"),
            "psi_threshold": threshold,
            "fleet": next((d for d in docs if d["device_id"] == FLEET), None),
            "devices": [d for d in docs if d["device_id"] != FLEET],
        }
    )
