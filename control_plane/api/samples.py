"""Captured samples' routes (viewer): ``GET /api/v1/models/{name}/samples`` (per version),
``GET /api/v1/models/{name}/versions/{version}/samples`` (paged descriptions) and
``.../samples/{id}/data`` (one sample's ``.npz`` archive)."""

from __future__ import annotations

from fastapi import APIRouter, Path, Query
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from control_plane.api.deps import SESSION, VERSION, VIEWER, json_response
from control_plane.errors import NotFound
from control_plane.quality.capture import MAX_PAGE, sample_data, sample_page, sample_versions
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Model registry"])


@router.get("/models/{name}/samples", summary="Captured samples per version of a model")
async def sample_summary(name: str, s: AsyncSession = SESSION, _: Principal = VIEWER) -> Response:
    return json_response({"model": name, "versions": await sample_versions(s, name)})


@router.get(
    "/models/{name}/versions/{version}/samples",
    summary="Samples devices captured of a version (data capture), oldest first, paged",
)
async def list_samples(
    name: str,
    version: int = VERSION,
    after: int = Query(
        default=0, ge=0, le=2**63 - 1, description="the ``next`` of the previous page"
    ),
    limit: int = Query(default=100, ge=1, le=MAX_PAGE, description="samples in the page"),
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    return json_response(await sample_page(s, name, version, after=after, limit=limit))


@router.get(
    "/models/{name}/versions/{version}/samples/{sample}/data",
    summary="One captured sample's tensors: an .npz of input:NAME and output:NAME arrays",
)
async def get_sample_data(
    name: str,
    version: int = VERSION,
    sample: int = Path(ge=1, le=2**63 - 1, description="the sample's id in the list"),
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    data = await sample_data(s, name, version, sample)
    if data is None:
        raise NotFound(f"{name} v{version} has no sample {sample}")
    return Response(data, media_type="application/octet-stream")
