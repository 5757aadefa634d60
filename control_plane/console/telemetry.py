"""Telemetry charts per model version: the last hour from the API's telemetry windows, then a
point every ``console_live_interval_s`` over server-sent events. Requests and errors of the
live points come from the fleet counters that /metrics serves, whose cost grows with neither
the fleet nor its message rate; their p50 and p99 from a bounded page of the tick's newest
windows, read through the API."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from starlette.responses import Response, StreamingResponse

from control_plane.api.deps import services
from control_plane.console import views
from control_plane.console.sessions import secure_headers
from control_plane.console.web import OPERATOR, BadForm, Operator, render
from control_plane.metrics import FleetMetrics

router = APIRouter(prefix="/ui", include_in_schema=False)
MODEL_VERSIONS = Query(default=[], description="model:version; repeat for several")

HISTORY_BUCKET_S = 60.0
HISTORY_WINDOWS = 10_000
"""Telemetry windows read for the last hour (the API's largest page)."""
TICK_WINDOWS = 50
"""Newest windows a live point's p50 and p99 are taken from."""
STREAM_S = 300.0
"""A stream ends after this long; the browser's EventSource reconnects by itself, and a
logged-out or revoked session is not streamed to for longer."""


def _model_versions(values: list[str]) -> list[tuple[str, int]]:
    out = []
    for value in values:
        model, _, version = value.partition(":")
        if not model or not version.isdigit():
            raise BadForm(400, f"mv: expected model:version, got {value!r}")
        out.append((model, int(version)))
    return out


@router.get("/telemetry")
async def page(
    request: Request, mv: list[str] = MODEL_VERSIONS, who: Operator = OPERATOR
) -> Response:
    summary = await who.api.get("/api/v1/devices/summary")
    served = views.fleet_counts(summary).versions
    running = [f"{m}:{v}" for m, versions in served.items() for v in versions]
    chosen = _model_versions(mv or running)
    keys = [f"{m}:{v}" for m, v in chosen]
    return render(request, "telemetry.html", who, running=running, chosen=chosen, chosen_keys=keys)


@router.get("/telemetry/history")
async def history(model: str, version: int = Query(ge=1), who: Operator = OPERATOR) -> Response:
    windows = await who.api.get(
        "/api/v1/telemetry", model=model, version=version, since_s=3600, limit=HISTORY_WINDOWS
    )
    points = views.history(windows, time.time(), HISTORY_BUCKET_S)
    if len(windows) == HISTORY_WINDOWS and points:
        points = points[1:]  # the oldest bucket was cut by the page's end: not undercounted
    body = orjson.dumps([dataclasses.asdict(p) for p in points])
    return secure_headers(Response(body, media_type="application/json"))


def _counters(metrics: FleetMetrics) -> dict[tuple[str, int], tuple[float, float]]:
    """Requests and errors so far per (model, version): the fleet counters /metrics serves,
    read in process. Rendering /metrics whole cost 13 ms at 5,000 devices (its presence
    gauges walk every device), most of a live point's cost; these two cost 10 us."""
    sums: dict[tuple[str, int], list[float]] = {}
    for column, counter in enumerate((metrics.requests, metrics.errors)):
        for family in counter.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    key = (sample.labels["model"], int(sample.labels["version"]))
                    sums.setdefault(key, [0.0, 0.0])[column] = sample.value
    return {k: (v[0], v[1]) for k, v in sums.items()}


async def _points(
    request: Request, who: Operator, chosen: list[tuple[str, int]]
) -> AsyncIterator[bytes]:
    svc = services(request)
    tick_s = svc.settings.console_live_interval_s
    yield b"retry: 2000\n\n"
    before = _counters(svc.metrics)
    last = time.monotonic()
    started = last
    # the response cancels this generator when the browser goes away
    while last - started < STREAM_S:
        await asyncio.sleep(tick_s)
        now = time.monotonic()
        counts = _counters(svc.metrics)
        for model, version in chosen:
            windows = await who.api.get(
                "/api/v1/telemetry",
                model=model,
                version=version,
                since_s=now - last,
                limit=TICK_WINDOWS,
            )
            p = views.point(time.time(), windows, now - last)
            requests, errors = (
                a - b
                for a, b in zip(
                    counts.get((model, version), (0.0, 0.0)),
                    before.get((model, version), (0.0, 0.0)),
                    strict=True,
                )
            )
            p = dataclasses.replace(
                p,
                requests_per_s=requests / (now - last),
                error_rate=errors / requests if requests else None,
            )
            doc: dict[str, Any] = {"model": model, "version": version} | dataclasses.asdict(p)
            yield b"data: " + orjson.dumps(doc) + b"\n\n"
        before, last = counts, now


@router.get("/telemetry/stream")
async def stream(
    request: Request, mv: list[str] = MODEL_VERSIONS, who: Operator = OPERATOR
) -> Response:
    chosen = _model_versions(mv)
    response = StreamingResponse(_points(request, who, chosen), media_type="text/event-stream")
    return secure_headers(response)
