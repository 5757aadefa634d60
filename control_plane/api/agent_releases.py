"""Agent release routes: push a release tree's ``.tar.gz`` (operator), list and show them
(viewer). Rolling one out is ``POST /api/v1/rollouts`` with ``agent_version``."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from control_plane.api import audit
from control_plane.api.deps import OPERATOR, SESSION, VIEWER, json_response, services
from control_plane.registry.agent_releases import (
    add_release,
    check_version,
    get_release,
    list_releases,
    release_doc,
)
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Agent releases"])


@router.put(
    "/agent-releases/{version}",
    status_code=201,
    summary="Push an agent release: the body is a release tree's .tar.gz (streamed)",
)
async def push_release(
    version: str,
    request: Request,
    description: str = Query(default="", max_length=2000),
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    check_version(version)  # before a byte is stored
    svc = services(request)

    async def body() -> AsyncIterator[bytes]:
        async for chunk in request.stream():
            yield chunk

    sha, size = await svc.store.put(body())
    release = await add_release(
        s, svc.store, version, sha, size, user=who.name, description=description
    )
    audit.record(s, who.name, "agent_release.push", version, sha256=sha, size=size)
    await s.commit()
    return json_response(release_doc(release), 201)


@router.get("/agent-releases", summary="Agent releases, oldest first")
async def list_agent_releases(s: AsyncSession = SESSION, _: Principal = VIEWER) -> Response:
    return json_response([release_doc(r) for r in await list_releases(s)])


@router.get("/agent-releases/{version}", summary="One agent release")
async def show_agent_release(
    version: str, s: AsyncSession = SESSION, _: Principal = VIEWER
) -> Response:
    check_version(version)
    return json_response(release_doc(await get_release(s, version)))
