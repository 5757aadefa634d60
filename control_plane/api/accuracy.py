"""The concept drift monitor wired into the app, and live accuracy's route:
``GET /api/v1/models/{name}/versions/{version}/accuracy`` (viewer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, FastAPI, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from control_plane.api.deps import SESSION, VERSION, VIEWER, Services, json_response, services
from control_plane.quality.accuracy import accuracy_report, concept_drift, live_sums
from control_plane.quality.accuracy import reference_accuracy as reference_of
from control_plane.quality.concept_drift import ConceptDriftMonitor
from control_plane.registry.store import get_version
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Model registry"])
YEAR_S = 366 * 86400.0


def attach(app: FastAPI, svc: Services) -> None:
    """Create the monitor (run by the app's lifespan), feed it from ingest, mount the route."""
    monitor = ConceptDriftMonitor(svc.sessions, svc.metrics, svc.settings.ground_truth)
    svc.ingestor.on_sketches.append(monitor.offer)
    app.state.concept_drift = monitor
    app.include_router(router)


@router.get(
    "/models/{name}/versions/{version}/accuracy",
    summary="Live accuracy (or error) from the outcomes apps posted, and concept drift",
)
async def show_accuracy(
    request: Request,
    name: str,
    version: int = VERSION,
    since_s: float = Query(default=3600.0, gt=0, le=YEAR_S, description="how far back, in seconds"),
    bucket_s: float = Query(
        default=300.0, ge=1, le=YEAR_S, description="the time buckets' width, in seconds"
    ),
    group_by: str | None = Query(
        default=None, min_length=1, max_length=128, description="a device label to group by"
    ),
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    mv = await get_version(s, name, version)  # 404 for an unknown version
    settings = services(request).settings.ground_truth
    now = datetime.now(UTC)
    since = now - timedelta(seconds=since_s)
    doc = await accuracy_report(s, mv, name, since, now, bucket_s=bucket_s, group_by=group_by)
    # concept drift is judged over the monitor's window, whatever span is shown
    window = now - timedelta(seconds=settings.window_s)
    live = await live_sums(s, name, version, window, now)
    doc["concept_drift"] = concept_drift(
        live, reference_of(mv), settings.concept_drift_threshold, settings.min_outcomes
    ) | {"window_s": settings.window_s, "accuracy": live.accuracy}
    return json_response(doc)
