"""The FastAPI application: routes, error handling, request context, lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from agent import __version__
from agent.api import repository, tfserving, v2
from agent.api.access import ApiKeys, RateLimiter
from agent.api.admission import Admission
from agent.api.context import RequestContext
from agent.api.errors import HANDLED, handle_error
from agent.api.fastpath import InferFastPath
from agent.api.state import ApiState

log = logging.getLogger("edgefleet.agent")


def create_app(state: ApiState) -> FastAPI:
    """The app over an already wired :class:`ApiState`. Models load in the background after
    start-up, so liveness answers at once and readiness follows the loads."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def start() -> None:
            await state.manager.load_all()
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
            log.info("models closed")

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
    # Handlers for the domain errors answer and carry on; a handler for Exception itself
    # runs in Starlette's ServerErrorMiddleware, which re-raises and drops the connection.
    for cls in HANDLED:
        app.add_exception_handler(cls, handle_error)
    app.add_exception_handler(Exception, handle_error)
    settings = state.settings
    # innermost: inside admission and the request context, before the router
    app.add_middleware(InferFastPath)
    app.add_middleware(
        Admission,
        keys=ApiKeys.from_settings(settings.api_key, settings.api_keys_file),
        limiter=(
            RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst)
            if settings.rate_limit_per_s is not None
            else None
        ),
        open_paths=settings.api_key_open_paths,
        body_timeout_s=settings.body_timeout_s,
    )
    # added last, so outermost: the access log sees what admission turned away too
    app.add_middleware(RequestContext, access_log=settings.access_log)
    return app
