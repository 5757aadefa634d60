"""The control plane's FastAPI application: the routes of every area (:mod:`control_plane.api`),
the operator console under ``/ui/``, and the lifespan that runs the long-lived tasks. At the top
of the control plane, so that no area, and no route module, imports another's routes."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from starlette.responses import Response

from common import __version__
from control_plane.api import (
    accuracy,
    admin,
    agent_releases,
    bundles,
    costs,
    deployments,
    diagnostics,
    drift,
    enrolment,
    fleet,
    models,
    samples,
    twins,
)
from control_plane.api.deps import Services, handle_error, json_response
from control_plane.console.web import mount as mount_console
from control_plane.errors import ControlPlaneError
from control_plane.ingest import retention
from control_plane.ingest.ingestor import HELD_PER_MESSAGE
from control_plane.settings import ControlPlaneSettings
from control_plane.signing.trust import TrustManager
from control_plane.tokens import bootstrap_admin

log = logging.getLogger("edgefleet.control_plane")


def gc_thresholds(settings: ControlPlaneSettings) -> tuple[int, int, int]:
    """The cyclic collector's thresholds. Its youngest generation is collected once this many
    more container objects were made than freed since the last collection: more than ingest
    keeps for the most device messages it can hold (``mqtt_broker_inflight``, as the broker
    sends no more before they are stored), so the messages in flight are not rescanned while
    they wait for their batch. Measured in the fleet stack at 30,000 msg/s (40,000 in flight):
    the control plane used 0.46 of a core with 400,000, 0.49 with 50,000 (the collector 14 %
    of its main thread's samples), and the default 700 cost 8-10 us per message."""
    return (max(50_000, HELD_PER_MESSAGE * settings.mqtt_broker_inflight), 20, 100)


def create_app(svc: Services, trust: TrustManager) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        token_file = svc.settings.state_dir / "admin-token"
        if await bootstrap_admin(svc.sessions, token_file):
            log.warning("created the first admin token", extra={"file": str(token_file)})
        await trust.ensure()
        # what is alive now lives as long as the process: out of the cyclic collector's
        # full passes, which otherwise rescan it while thousands of messages a second churn
        # (garbage first: what is frozen is never collected, its files and sockets never closed)
        gc.collect()
        gc.freeze()
        # Ingest holds thousands of young messages between their arrival and their batch's
        # commit: the collector must not rescan them over and over (see gc_thresholds)
        thresholds = gc.get_threshold()
        gc.set_threshold(*gc_thresholds(svc.settings))
        tasks = [
            asyncio.create_task(svc.bus.run(), name="mqtt"),
            asyncio.create_task(svc.ingestor.run(), name="ingest"),
            asyncio.create_task(app.state.drift.run(), name="drift"),
            asyncio.create_task(app.state.diagnostics.run(), name="diagnostics"),
            asyncio.create_task(app.state.rates.run(), name="cost-rates"),
            asyncio.create_task(app.state.concept_drift.run(), name="concept-drift"),
            # the loops that must not run twice: on the replica that leads, while it leads
            asyncio.create_task(
                svc.engine.leadership.run(
                    rollouts=svc.engine.run,
                    deployments=app.state.deployments.run,
                    maintenance=functools.partial(retention.run, svc.sessions, svc.settings),
                ),
                name="leadership",
            ),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await svc.ingestor.drain()
            # the pool's connections: a process that goes on (an embedding one, a test) keeps
            # none of them open
            await svc.sessions.kw["bind"].dispose()
            gc.unfreeze()
            gc.set_threshold(*thresholds)
            provider = getattr(app.state, "tracer_provider", None)
            if provider is not None:  # the spans still queued, within the SDK's timeout
                await asyncio.to_thread(provider.shutdown)
            log.info("control plane stopped")

    app = FastAPI(
        title="edgefleet control plane",
        version=__version__,
        lifespan=lifespan,
        description="Model registry, device inventory, staged rollouts, telemetry.",
    )
    app.state.services = svc
    app.state.trust = trust
    app.include_router(models.router)
    app.include_router(models.artifacts)
    app.include_router(agent_releases.router)
    app.include_router(fleet.router)
    app.include_router(admin.router)
    app.include_router(samples.router)
    app.include_router(bundles.router)
    costs.attach(app, svc)
    enrolment.attach(app, svc)
    deployments.attach(app, svc)
    drift.attach(app, svc)
    diagnostics.attach(app, svc)
    accuracy.attach(app, svc)
    twins.attach(app, svc)
    app.add_exception_handler(ControlPlaneError, handle_error)
    app.add_exception_handler(RequestValidationError, handle_error)
    app.add_exception_handler(DBAPIError, handle_error)  # 503 while the database is away
    mount_console(app)  # the operator console under /ui/, a client of the routes above
    if svc.tracer_provider is not None:
        # imported here: a control plane that does not trace never loads the SDK
        from control_plane.api import tracing

        app.state.tracer_provider = svc.tracer_provider
        app.add_middleware(tracing.ApiTracing, provider=svc.tracer_provider)

    @app.get("/health", tags=["Observability"], summary="Database and broker reachability")
    async def health(request: Request) -> Response:
        db_ok = True
        try:
            async with svc.sessions() as s:
                await s.execute(text("SELECT 1"))
        except Exception:
            db_ok = False
        ok = db_ok and svc.bus.connected.is_set()
        return json_response(
            {
                "status": "ok" if ok else "degraded",
                "database": db_ok,
                "mqtt": svc.bus.connected.is_set(),
                # replicas: who runs the rollouts, under which fencing epoch
                "leader": svc.engine.leadership.view(),
            },
            200 if ok else 503,
        )

    @app.get("/metrics", tags=["Observability"], summary="Prometheus metrics of the fleet")
    async def metrics() -> Response:
        return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
