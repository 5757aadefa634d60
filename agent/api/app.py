"""The FastAPI application: routes, error handling, request context, lifespan."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from starlette.responses import Response
from starlette.types import ASGIApp

from agent.api import config, feedback, repository, sharedmemory, tfserving, v2
from agent.api.admission import Admission
from agent.api.context import RequestContext
from agent.api.errors import handle_error
from agent.api.fastpath import InferFastPath
from agent.serving.access import ApiKeys, RateLimiter
from agent.serving.errors import DOMAIN_ERRORS
from agent.serving.state import ServingState
from common import __version__

log = logging.getLogger("edgefleet.agent")


def create_app(
    state: ServingState,
    routers: tuple[APIRouter, ...] = (),
    answers: tuple[tuple[frozenset[str], Callable[[Exception], Response]], ...] = (),
) -> ASGIApp:
    """The ASGI app over an already wired :class:`ServingState`: FastAPI inside the request
    context, admission (API keys, rate limit, body deadline) and the infer fast path. Models
    load in the background after start-up, so liveness answers at once and readiness follows
    the loads.

    ``routers`` are other front ends on the same port (the OpenAI-compatible one), and
    ``answers`` the error renderers of their paths, for what admission turns away."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def start() -> None:
            await state.manager.load_all()
            if state.generative is not None:
                await state.generative.load_all()
            # Everything alive now (modules, schemas, sessions) lives as long as the process:
            # keep it out of the cyclic collector's scans, whose full passes over it were the
            # latency tail under load.
            gc.freeze()
            state.loaded = True
            log.info("start-up load finished", extra={"ready": state.ready()})
            if state.fleet is not None:
                # after the local load: the fleet's desired state applies on top of it
                try:
                    await state.fleet.run()
                except Exception:
                    # the agent keeps serving locally; the failure must be visible though
                    log.exception("fleet client stopped")
                    raise

        background = asyncio.create_task(start(), name="startup-and-fleet")
        try:
            yield
        finally:
            # uvicorn has stopped accepting and waited for in-flight requests by now.
            state.service.accepting = False
            background.cancel()
            await asyncio.gather(background, return_exceptions=True)
            await state.manager.close()
            if state.generative is not None:
                await state.generative.close()
            log.info("models closed")
            if state.tracing is not None:  # the spans still queued, within the SDK's timeout
                await asyncio.to_thread(state.tracing.shutdown)
            if state.service.payloads is not None:  # the records still queued
                await asyncio.to_thread(state.service.payloads.close)
            if state.service.capture is not None:  # the samples still queued, then the spool
                await asyncio.to_thread(state.service.capture.close)
                state.service.capture.spool.close()

    app = FastAPI(
        title="edgefleet agent",
        version=__version__,
        lifespan=lifespan,
        description="Local inference: KServe V2 (Open Inference Protocol) and TF Serving REST.",
    )
    app.state.api = state
    app.include_router(v2.router)
    app.include_router(tfserving.router)
    app.include_router(repository.router)
    app.include_router(sharedmemory.router)
    app.include_router(feedback.router)
    app.include_router(config.router)
    # Handlers for the domain errors answer and carry on; a handler for Exception itself
    # runs in Starlette's ServerErrorMiddleware, which re-raises and drops the connection.
    for cls in DOMAIN_ERRORS:
        app.add_exception_handler(cls, handle_error)
    app.add_exception_handler(Exception, handle_error)
    settings = state.settings
    if state.serves_generative:
        # imported here: an agent without generative models never loads the token loop
        from agent.api import generate

        app.include_router(generate.router)
    for router in routers:
        app.include_router(router)
    admission = Admission(
        app,
        keys=ApiKeys.from_settings(settings.api_key, settings.api_keys_file),
        limiter=RateLimiter.from_settings(settings.rate_limit_per_s, settings.rate_limit_burst),
        open_paths=settings.api_key_open_paths,
        answers=answers,
    )
    # Outside FastAPI's own middleware stack, so that the infer fast path skips it too; the
    # request context is outside admission, so the access log sees what admission turned away.
    return InferFastPath(
        RequestContext(admission, access_log=settings.access_log, tracing=state.tracing),
        state,
        admission,
        access_log=settings.access_log,
    )
