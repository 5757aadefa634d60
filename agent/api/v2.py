"""KServe V2 / Open Inference Protocol REST, with Triton's binary, classification, statistics,
model configuration and schedule-policy extensions."""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import Receive, Scope

from agent.api.openapi import V2_INFER
from agent.api.v2_codec import (
    DecodedRequest,
    check_classification,
    decode_request,
    encode_response,
)
from agent.errors import RequestError
from agent.http.transport import (
    ClientGone,
    json_response,
    receive_body,
    request_context,
    server_timing,
    until_disconnect,
)
from agent.inference.pipelined import PipelineVersion
from agent.inference.service import InferRequest, InferResponse
from agent.inference.versions import LoadedVersion
from agent.serving.classification import classify
from agent.serving.metadata import EXTENSIONS, SERVER_NAME
from agent.serving.state import ServingState
from agent.serving.triton_config import triton_config
from agent.shm import tensors
from agent.shm.answers import hold_until_answered
from agent.shm.regions import Lease
from agent.tracing import SpanTiming
from common import __version__

router = APIRouter(tags=["KServe V2"])

_UNSUPPORTED_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
_MAX_LENGTH_DIGITS = 18
"""Digits of the longest Inference-Header-Content-Length read (bodies are far shorter)."""


def _state(request: Request) -> ServingState:
    state: ServingState = request.app.state.api
    return state


@router.get("/v2/health/live", summary="Server liveness")
async def live() -> Response:
    return json_response({"live": True})


@router.get(
    "/v2/health/ready",
    summary="Server readiness: started, and every model loaded from the repository serves",
)
async def ready(request: Request) -> Response:
    # what Ready means (empty repositories, fleets, strict_readiness): ServingState.ready
    ok = _state(request).ready()
    return json_response({"ready": ok}, status=200 if ok else 503)


@router.get("/v2", summary="Server metadata")
async def server_metadata() -> Response:
    return json_response({"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS})


def _metadata(lv: LoadedVersion, versions: list[int]) -> dict[str, Any]:
    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in specs]

    return {
        "name": lv.model,
        "versions": [str(v) for v in versions],
        "platform": lv.platform,
        "inputs": tensors(lv.signature.inputs),
        "outputs": tensors(lv.signature.outputs),
        "parameters": {
            "placement": lv.placement.describe(),
            "batched": lv.batcher.batched,
            "max_batch_size": lv.batcher.max_rows,
            **({} if lv.tuning is None else {"batch_tuning": lv.tuning.describe()}),
            **_pipeline_steps(lv),
        },
    }


def _pipeline_steps(lv: LoadedVersion) -> dict[str, Any]:
    """A pipeline's steps by name and kind, in order; nothing for a plain model."""
    if not isinstance(lv, PipelineVersion) or lv.pipeline is None:
        return {}
    return {"steps": [f"{n}:{s.kind}" for n, s in lv.pipeline.config.named_steps()]}


@router.get("/v2/models/stats", summary="Statistics of every served model version")
@router.get("/v2/models/{model_name}/stats", summary="Statistics of a model's served versions")
@router.get(
    "/v2/models/{model_name}/versions/{model_version}/stats", summary="Statistics of one version"
)
async def model_stats(
    request: Request, model_name: str | None = None, model_version: str | None = None
) -> Response:
    state = _state(request)
    if model_version is not None and model_name is not None:
        versions = [state.service.resolve(model_name, model_version)]
    elif model_name is not None:
        state.service.resolve(model_name, None)
        versions = list(state.manager.models[model_name].served.values())
    else:
        versions = [lv for e in state.manager.models.values() for lv in e.served.values()]
    return json_response(
        {"model_stats": [lv.stats.to_dict(lv.model, str(lv.version)) for lv in versions]}
    )


@router.get("/v2/models/{model_name}", summary="Model metadata (newest ready version)")
@router.get("/v2/models/{model_name}/versions/{model_version}", summary="Model version metadata")
async def model_metadata(
    request: Request, model_name: str, model_version: str | None = None
) -> Response:
    lv = _state(request).service.resolve(model_name, model_version)
    served = sorted(_state(request).manager.models[model_name].served)
    return json_response(_metadata(lv, served))


@router.get("/v2/models/{model_name}/ready", summary="Model readiness")
@router.get(
    "/v2/models/{model_name}/versions/{model_version}/ready", summary="Model version readiness"
)
async def model_ready(
    request: Request, model_name: str, model_version: str | None = None
) -> Response:
    from agent.errors import ModelNotReadyError

    try:
        _state(request).service.resolve(model_name, model_version)
    except ModelNotReadyError:
        return json_response({"name": model_name, "ready": False}, status=503)
    return json_response({"name": model_name, "ready": True})


@router.get("/v2/models/{model_name}/config", summary="Model configuration (Triton extension)")
@router.get(
    "/v2/models/{model_name}/versions/{model_version}/config", summary="Model version configuration"
)
async def model_config(
    request: Request, model_name: str, model_version: str | None = None
) -> Response:
    state = _state(request)
    lv = state.service.resolve(model_name, model_version)
    doc = lv.config.model_dump(mode="json")
    doc |= {
        "name": lv.model,
        "version": str(lv.version),
        "platform": lv.platform,
        "placement": lv.placement.model_dump(mode="json"),
    }
    if isinstance(lv, PipelineVersion) and lv.pipeline is not None:  # the one serving
        doc["pipeline"] = lv.pipeline.config.model_dump(mode="json")
    if lv.tuning is not None:  # as served: the size measured at load, and the measurement
        doc["batching"] = lv.batcher.config.model_dump(mode="json")
        doc["batch_tuning"] = lv.tuning.describe()
    # Triton's document at the top, as its tools read it; edgefleet's own beside it
    served = sorted(state.manager.models[lv.model].served)
    return json_response(triton_config(lv, served) | {"edgefleet": doc})


@router.post("/v2/models/{model_name}/infer", summary="Inference", openapi_extra=V2_INFER)
@router.post(
    "/v2/models/{model_name}/versions/{model_version}/infer",
    summary="Inference on a version",
    openapi_extra=V2_INFER,
)
async def infer(request: Request, model_name: str, model_version: str | None = None) -> Response:
    """Documents the infer routes; requests reach :func:`handle_infer` by the fast path
    (:mod:`agent.api.fastpath`) before FastAPI routes them."""
    status, headers, body = await handle_infer(
        _state(request), request.scope, request.receive, model_name, model_version
    )
    return Response(body, status, headers={k.decode(): v.decode() for k, v in headers})


Headers = list[tuple[bytes, bytes]]
Answer = tuple[int, Headers, bytes]
"""Status, headers (the content type among them, not its length) and body."""
JSON_TYPE = (b"content-type", b"application/json")
_BINARY = (b"content-type", b"application/octet-stream")


async def handle_infer(
    state: ServingState, scope: Scope, receive: Receive, model_name: str, model_version: str | None
) -> Answer:
    """``POST /v2/models/{model_name}[/versions/{model_version}]/infer``, in ASGI terms."""
    started = time.monotonic()
    context = request_context(scope)
    context["model"], context["version"] = model_name, model_version
    headers = dict(scope["headers"])
    state.service.resolve(model_name, model_version)  # an unknown model before its body
    body = await receive_body(receive, headers, state.settings.max_request_bytes)
    call = start_infer(state, scope, headers, body, model_name, model_version, started)
    try:
        result = await until_disconnect(scope, receive, _wait(call.answer))
    except ClientGone:
        return 499, [], b""
    return call.respond(result)


async def _wait(future: asyncio.Future[InferResponse]) -> InferResponse:
    # a coroutine for until_disconnect; a cancelled task cancels the future it awaits, which
    # drops the request from its batcher (InferenceService.submit)
    return await future


@dataclass(frozen=True, slots=True)
class InferCall:
    """A V2 infer request queued for its model: the answer to wait for, and what writing the
    response needs."""

    answer: asyncio.Future[InferResponse]
    decoded: DecodedRequest
    context: dict[str, Any]
    started: float
    written: dict[str, tuple[str, list[int], int]] = field(default_factory=dict)
    """Outputs written into shared memory regions before ``answer`` resolves (the response
    lists them with no data)."""

    def respond(self, result: InferResponse) -> Answer:
        """The response to the request, from its result."""
        decoded, context = self.decoded, self.context
        request_id = decoded.id if decoded.id is not None else context["request_id"]
        encoding = time.monotonic()
        payload, json_length = encode_response(
            result.model,
            result.version,
            request_id,
            result.outputs,
            decoded.outputs,
            decoded.binary_output_default,
            self.written,
        )
        answered = time.monotonic()
        total = answered - self.started
        context["model"], context["version"] = result.model, result.version
        context["timing"] = SpanTiming(
            result.queue_s,
            result.compute_s,
            answered,
            result.batch_rows,
            result.steps,
            decode_s=context.get("decode_s", 0.0),
            encode_s=answered - encoding,
        )
        context["queue_ms"] = round(result.queue_s * 1000, 3)
        context["compute_ms"] = round(result.compute_s * 1000, 3)
        timing_value = server_timing(result.queue_s, result.compute_s, total)
        if result.steps:  # a pipeline's steps, each as its own metric
            timing_value += "".join(
                f", step_{name};dur={seconds * 1000:.3f}" for name, seconds in result.steps
            )
        timing = (b"server-timing", timing_value.encode())
        if json_length is None:
            return 200, [JSON_TYPE, timing], payload
        length = (b"inference-header-content-length", b"%d" % json_length)
        return 200, [_BINARY, timing, length], payload


def start_infer(
    state: ServingState,
    scope: Scope,
    headers: dict[bytes, bytes],
    body: bytes,
    model_name: str,
    model_version: str | None,
    started: float,
) -> InferCall:
    """Decode and check an infer request's (whole) body and queue it; a request at fault
    raises here, before anything is queued."""
    context = request_context(scope)
    context["model"], context["version"] = model_name, model_version
    lv = state.service.resolve(model_name, model_version)
    context["placement"] = lv.placement  # a request span's runtime and execution provider
    header = headers.get(b"inference-header-content-length")
    if header is not None and not header.strip().isdigit():
        raise RequestError(
            "Inference-Header-Content-Length must be a non-negative integer",
            field="Inference-Header-Content-Length",
        )
    if header is not None and len(header.strip()) > _MAX_LENGTH_DIGITS:
        # int() refuses over 4,300 digits (a ValueError, a 500); no body is that long anyway
        raise RequestError(
            f"Inference-Header-Content-Length has {len(header.strip())} digits, more than any "
            f"body's length ({_MAX_LENGTH_DIGITS} at most)",
            field="Inference-Header-Content-Length",
        )
    registry = state.shared_memory
    lease = None if registry is None else registry.lease()
    try:
        decoding = time.monotonic()
        decoded = decode_request(
            body,
            int(header) if header is not None else None,
            lv.signature,
            max_elements=state.settings.max_tensor_elements,
            lease=lease,
        )
        context["decode_s"] = time.monotonic() - decoding
        return _submit(state, lv, decoded, lease, model_name, model_version, context, started)
    except BaseException:
        if lease is not None:
            lease.release()
        raise


def _submit(
    state: ServingState,
    lv: LoadedVersion,
    decoded: DecodedRequest,
    lease: Lease | None,
    model_name: str,
    model_version: str | None,
    context: dict[str, Any],
    started: float,
) -> InferCall:
    check_classification(decoded.outputs, lv.signature)
    params = decoded.parameters
    for key in _UNSUPPORTED_PARAMETERS:
        if key in params:
            raise RequestError(
                f"parameters.{key}: sequence batching is not supported", field=f"parameters.{key}"
            )
    priority, timeout = params.get("priority", 0), params.get("timeout")
    if type(priority) is not int or priority < 0:
        raise RequestError(
            "parameters.priority must be a non-negative integer", field="parameters.priority"
        )
    if timeout is not None and (type(timeout) is not int or timeout < 0):
        raise RequestError(
            "parameters.timeout must be a non-negative integer of microseconds",
            field="parameters.timeout",
        )
    infer_request = InferRequest(
        model_name,
        decoded.inputs,
        model_version,
        [o.name for o in decoded.outputs] if decoded.outputs is not None else None,
        priority,
        timeout,
        decoded.id if decoded.id is not None else context.get("request_id"),
    )
    # resolved above, in this turn of the event loop: no swap came in between
    answer = state.service.submit(infer_request, lv)
    written: dict[str, tuple[str, list[int], int]] = {}
    if lease is not None and lease.regions:
        # NOTE: Triton's shared memory extension: outputs go into their regions and the
        # response lists them without data; the lease is released once the answer is done
        answer = hold_until_answered(
            answer, lease, functools.partial(_write_outputs, decoded, lease, written)
        )
    return InferCall(answer, decoded, context, started, written)


def _write_outputs(
    decoded: DecodedRequest,
    lease: Lease,
    written: dict[str, tuple[str, list[int], int]],
    result: InferResponse,
) -> None:
    """Write the outputs asked for in regions into them, while the lease holds them."""
    for spec in decoded.outputs or ():
        if spec.region is None:
            continue
        array = result.outputs[spec.name]
        if spec.classification:
            array = classify(array, spec.classification)
        datatype, size = tensors.write(lease, spec.region, array)
        written[spec.name] = (datatype, list(array.shape), size)
