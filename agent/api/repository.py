"""Triton's model repository extension, and the Prometheus endpoint."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from agent.errors import RequestError
from agent.http.transport import json_response, read_body
from agent.serving.state import ServingState

router = APIRouter(tags=["Model repository"])
_SMALL_BODY = 64 * 1024


def _state(request: Request) -> ServingState:
    state: ServingState = request.app.state.api
    return state


async def _json_object(request: Request) -> dict[str, object]:
    body = await read_body(request, _SMALL_BODY, "the repository API's body limit")
    if not body.strip():
        return {}
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"body: not valid JSON ({exc})", field="body") from None
    if not isinstance(doc, dict):
        raise RequestError("body: must be a JSON object", field="body")
    return doc


@router.get("/v2/repository/index", summary="Every model in the repository with its state")
@router.post(
    "/v2/repository/index", summary='Repository index; body {"ready": true} lists ready ones'
)
async def repository_index(request: Request) -> Response:
    doc = await _json_object(request) if request.method == "POST" else {}
    only_ready = doc.get("ready", False)
    if not isinstance(only_ready, bool):
        raise RequestError("ready: must be true or false", field="ready")
    state = _state(request)
    rows = state.manager.index()
    if state.generative is not None:
        rows = sorted([*rows, *state.generative.index()], key=lambda r: (r["name"], r["version"]))
    if only_ready:
        rows = [r for r in rows if r["state"] == "READY"]
    return json_response(rows)


@router.post(
    "/v2/repository/models/{model_name}/load",
    summary="Load or reload a model: new versions are warmed, then swapped in atomically",
)
async def load_model(request: Request, model_name: str) -> Response:
    doc = await _json_object(request)
    if doc.get("parameters"):
        raise RequestError(
            "parameters: loading models from the request body is not supported; "
            "place them in the repository",
            field="parameters",
        )
    state = _state(request)
    if state.generative is not None and model_name in state.generative.names():
        # a generative model: its newest version is warmed, then takes new sequences while
        # those in flight finish on the old one
        loaded = await state.generative.load(model_name)
        return json_response({"name": model_name, "versions": [str(loaded.version)]})
    entry = await state.manager.load(model_name)
    return json_response({"name": model_name, "versions": [str(v) for v in sorted(entry.served)]})


@router.post(
    "/v2/repository/models/{model_name}/unload",
    summary="Unload a model after its in-flight requests finish",
)
async def unload_model(request: Request, model_name: str) -> Response:
    await _json_object(request)
    await _state(request).manager.unload(model_name)
    return json_response({"name": model_name, "unloaded": True})


@router.get("/metrics", summary="Prometheus metrics", tags=["Observability"])
async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
