"""Triton's system shared memory extension over REST: register, unregister, status; and its
CUDA shared memory routes, answered as a Triton without a GPU answers them.

NOTE: spec: https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_shared_memory.md
Errors are the V2 ``{"error": ...}`` body with 400, as Triton answers them; regions registered
here are the ones gRPC and REST infer requests name.
"""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from agent.errors import RequestError
from agent.http.transport import json_response, read_body
from agent.serving.state import ServingState
from agent.shm.regions import CUDA_UNSUPPORTED, SharedMemoryError, SharedMemoryRegistry

router = APIRouter(tags=["System shared memory"])
_SMALL_BODY = 64 * 1024


def _registry(request: Request) -> SharedMemoryRegistry:
    state: ServingState = request.app.state.api
    if state.shared_memory is None:
        raise SharedMemoryError("shared memory is not served by this agent", field="path")
    return state.shared_memory


@router.get("/v2/systemsharedmemory/status", summary="Every registered region")
@router.get("/v2/systemsharedmemory/region/{region_name}/status", summary="One region")
async def status(request: Request, region_name: str | None = None) -> Response:
    return json_response(_registry(request).status(region_name))


@router.post(
    "/v2/systemsharedmemory/region/{region_name}/register",
    summary='Register a region: body {"key": "/name", "offset": 0, "byte_size": n}',
)
async def register(request: Request, region_name: str) -> Response:
    body = await read_body(request, _SMALL_BODY, "the shared memory API's body limit")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"body: not valid JSON ({exc})", field="body") from None
    if not isinstance(doc, dict):
        raise RequestError("body: must be a JSON object", field="body")
    key = doc.get("key")
    if not isinstance(key, str):
        raise RequestError("key: must be a string", field="key")
    offset, size = _count(doc, "offset", 0), _count(doc, "byte_size", None)
    _registry(request).register(region_name, key, offset, size)
    return json_response({})


def _count(doc: dict[str, object], name: str, default: int | None) -> int:
    value = doc.get(name, default)
    if type(value) is not int or value < 0:
        raise RequestError(f"{name}: must be a non-negative integer", field=name)
    return value


@router.post("/v2/systemsharedmemory/unregister", summary="Unregister every region")
@router.post("/v2/systemsharedmemory/region/{region_name}/unregister", summary="Unregister one")
async def unregister(request: Request, region_name: str | None = None) -> Response:
    _registry(request).unregister(region_name)
    return json_response({})


# -- CUDA shared memory, as a Triton without a GPU answers it -----------------------------
# perf_analyzer (and Triton's clients) unregister CUDA regions along with system ones at the
# end of every shared-memory run: the status is empty, unregistering succeeds, and a register
# is refused with the reason, never a 404.


@router.get("/v2/cudasharedmemory/status", summary="CUDA regions: none on this agent")
async def cuda_status() -> Response:
    return json_response([])


@router.get("/v2/cudasharedmemory/region/{region_name}/status", summary="One CUDA region")
async def cuda_region_status(region_name: str) -> Response:
    raise SharedMemoryError(
        f"no CUDA shared memory region named {region_name!r}: {CUDA_UNSUPPORTED}", field="name"
    )


@router.post("/v2/cudasharedmemory/region/{region_name}/register", summary="Refused")
async def cuda_register(region_name: str) -> Response:
    raise SharedMemoryError(f"{region_name}: {CUDA_UNSUPPORTED}", field="name")


@router.post("/v2/cudasharedmemory/unregister", summary="Unregister every CUDA region")
@router.post("/v2/cudasharedmemory/region/{region_name}/unregister", summary="Unregister one")
async def cuda_unregister(region_name: str | None = None) -> Response:
    return json_response({})
