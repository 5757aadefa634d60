"""TensorFlow Serving REST: predict (row and columnar), classify and regress, model status and
metadata."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from agent.api.openapi import TF_EXAMPLES, TF_INFER
from agent.api.tfserving_codec import (
    decode_predict,
    encode_predict,
    metadata_document,
    status_document,
)
from agent.api.tfserving_examples import (
    decode_examples,
    encode_classify,
    encode_regress,
    labels,
    output_for,
)
from agent.errors import ModelNotFoundError
from agent.http.transport import (
    ClientGone,
    json_response,
    read_body,
    request_context,
    server_timing,
    until_disconnect,
)
from agent.inference.service import InferRequest
from agent.inference.versions import VersionState
from agent.serving.state import ServingState
from agent.tracing import SpanTiming

router = APIRouter(tags=["TensorFlow Serving"])

_TF_STATES = {
    VersionState.LOADING: "LOADING",
    VersionState.READY: "AVAILABLE",
    VersionState.STAGED: "LOADING",
    VersionState.STANDBY: "AVAILABLE",
    VersionState.UNLOADING: "UNLOADING",
    VersionState.UNAVAILABLE: "END",
}


def _state(request: Request) -> ServingState:
    state: ServingState = request.app.state.api
    return state


@router.get(
    "/v1/models/{model_name}",
    summary="Status of every version of a model (a generative model: OpenAI's model object)",
)
@router.get("/v1/models/{model_name}/versions/{model_version}", summary="Status of one version")
@router.get("/v1/models/{model_name}/labels/{version_label}", summary="Status of a labelled one")
async def model_status(
    request: Request,
    model_name: str,
    model_version: str | None = None,
    version_label: str | None = None,
) -> Response:
    state = _state(request)
    model_version = _labelled(state, model_name, model_version, version_label)
    if model_version is None and state.generative is not None:
        # NOTE: TF Serving's model status and OpenAI's "retrieve model" share this path; a
        # generative model answers as OpenAI's model object
        if model_name in state.generative.served:
            return json_response(state.generative.served[model_name].card())
    entry = state.manager.models.get(model_name)
    if entry is None:
        raise ModelNotFoundError(f"Servable not found for request: Latest({model_name})")
    rows = [(str(v), _TF_STATES[s.state], s.reason) for v, s in sorted(entry.status.items())]
    if model_version is not None:
        rows = [r for r in rows if r[0] == model_version]
        if not rows:
            raise ModelNotFoundError(
                f"Servable not found for request: Specific({model_name}, {model_version})"
            )
    return json_response(status_document(rows))


@router.get("/v1/models/{model_name}/metadata", summary="Signature of the newest version")
@router.get(
    "/v1/models/{model_name}/versions/{model_version}/metadata", summary="Signature of one version"
)
@router.get(
    "/v1/models/{model_name}/labels/{version_label}/metadata",
    summary="Signature of a labelled version",
)
async def model_metadata(
    request: Request,
    model_name: str,
    model_version: str | None = None,
    version_label: str | None = None,
) -> Response:
    state = _state(request)
    model_version = _labelled(state, model_name, model_version, version_label)
    lv = state.service.resolve(model_name, model_version)
    return json_response(metadata_document(lv.model, str(lv.version), lv.signature))


def _labelled(
    state: ServingState, model: str, version: str | None, label: str | None
) -> str | None:
    """The version ``label`` names in the model's ``[tfserving] version_labels`` (as the newest
    served version's config has them), else ``version``."""
    if label is None:
        return version
    entry = state.manager.models.get(model)
    served = entry.default_version if entry is not None else None
    if served is None:
        raise ModelNotFoundError(f"Servable not found for request: Latest({model})")
    number = served.config.tfserving.version_labels.get(label)
    if number is None:
        raise ModelNotFoundError(
            f"Unrecognized servable version label: {label}", field="version_label"
        )
    return str(number)


# Explicit operation ids: FastAPI derives them from the path with ':' and '/' both made '_',
# so ':predict' and its '/predict' alias would collide.
@router.post(
    "/v1/models/{model_name}:predict",
    summary="Predict (row or columnar format)",
    openapi_extra=TF_INFER,
    operation_id="tfserving_predict",
)
@router.post(
    "/v1/models/{model_name}/versions/{model_version}:predict",
    summary="Predict on a version",
    openapi_extra=TF_INFER,
    operation_id="tfserving_predict_version",
)
@router.post(
    "/v1/models/{model_name}/labels/{version_label}:predict",
    summary="Predict on a labelled version",
    openapi_extra=TF_INFER,
    operation_id="tfserving_predict_label",
)
@router.post(
    "/v1/models/{model_name}/predict", summary="Predict (alias of :predict)", openapi_extra=TF_INFER
)
@router.post(
    "/v1/models/{model_name}/versions/{model_version}/predict",
    summary="Predict on a version (alias)",
    openapi_extra=TF_INFER,
)
async def predict(
    request: Request,
    model_name: str,
    model_version: str | None = None,
    version_label: str | None = None,
) -> Response:
    state = _state(request)
    model_version = _labelled(state, model_name, model_version, version_label)
    lv = state.service.resolve(model_name, model_version)
    request_context(request.scope)["placement"] = lv.placement  # the request span's runtime
    body = await read_body(request, state.settings.max_request_bytes)
    inputs, rows = decode_predict(
        body, lv.signature, max_elements=state.settings.max_tensor_elements
    )
    return await _answer(
        request, model_name, model_version, inputs, lambda out, _: encode_predict(out, rows)
    )


@router.post(
    "/v1/models/{model_name}:classify",
    summary="Classify examples (the model's [tfserving] classify_output)",
    operation_id="tfserving_classify",
    openapi_extra=TF_EXAMPLES,
)
@router.post(
    "/v1/models/{model_name}/versions/{model_version}:classify",
    summary="Classify examples on a version",
    operation_id="tfserving_classify_version",
    openapi_extra=TF_EXAMPLES,
)
@router.post(
    "/v1/models/{model_name}/labels/{version_label}:classify",
    summary="Classify examples on a labelled version",
    operation_id="tfserving_classify_label",
    openapi_extra=TF_EXAMPLES,
)
async def classify(
    request: Request,
    model_name: str,
    model_version: str | None = None,
    version_label: str | None = None,
) -> Response:
    version = _labelled(_state(request), model_name, model_version, version_label)
    return await _examples(request, "classify", model_name, version)


@router.post(
    "/v1/models/{model_name}:regress",
    summary="Regress examples (the model's [tfserving] regress_output)",
    operation_id="tfserving_regress",
    openapi_extra=TF_EXAMPLES,
)
@router.post(
    "/v1/models/{model_name}/versions/{model_version}:regress",
    summary="Regress examples on a version",
    operation_id="tfserving_regress_version",
    openapi_extra=TF_EXAMPLES,
)
@router.post(
    "/v1/models/{model_name}/labels/{version_label}:regress",
    summary="Regress examples on a labelled version",
    operation_id="tfserving_regress_label",
    openapi_extra=TF_EXAMPLES,
)
async def regress(
    request: Request,
    model_name: str,
    model_version: str | None = None,
    version_label: str | None = None,
) -> Response:
    version = _labelled(_state(request), model_name, model_version, version_label)
    return await _examples(request, "regress", model_name, version)


async def _examples(
    request: Request, method: str, model_name: str, model_version: str | None
) -> Response:
    state = _state(request)
    lv = state.service.resolve(model_name, model_version)
    request_context(request.scope)["placement"] = lv.placement
    config = lv.config.tfserving
    if (config.classify_output if method == "classify" else config.regress_output) is None:
        output_for(config, method, {})  # the 400 naming the missing signature, before reading
    body = await read_body(request, state.settings.max_request_bytes)
    inputs = decode_examples(body, lv.signature, max_elements=state.settings.max_tensor_elements)

    def encode(outputs: dict[str, np.ndarray], version: str) -> bytes:
        # the version resolved is the one that ran, unless a swap came between
        served = lv if str(lv.version) == version else state.service.resolve(model_name, version)
        answer = output_for(served.config.tfserving, method, outputs)
        if method == "regress":
            return encode_regress(answer)
        classes = int(np.prod(answer.shape[1:])) if answer.ndim > 1 else 1
        names = labels(served.config.tfserving, served.model_file.parent, classes)
        return encode_classify(answer, names)

    return await _answer(request, model_name, model_version, inputs, encode)


async def _answer(
    request: Request,
    model_name: str,
    model_version: str | None,
    inputs: dict[str, np.ndarray],
    encode: Callable[[dict[str, np.ndarray], str], bytes],
) -> Response:
    """Run ``inputs`` and answer what ``encode`` makes of the outputs of the version that ran."""
    started = time.monotonic()
    context = request_context(request.scope)
    context["model"], context["version"] = model_name, model_version
    state = _state(request)
    try:
        result = await until_disconnect(
            request.scope,
            request.receive,
            state.service.infer(InferRequest(model_name, inputs, model_version)),
        )
    except ClientGone:
        return Response(status_code=499)
    context["model"], context["version"] = result.model, result.version
    context["queue_ms"] = round(result.queue_s * 1000, 3)
    context["compute_ms"] = round(result.compute_s * 1000, 3)
    answered = time.monotonic()
    context["timing"] = SpanTiming(
        result.queue_s, result.compute_s, answered, result.batch_rows, result.steps
    )
    timing = server_timing(result.queue_s, result.compute_s, answered - started)
    return Response(
        encode(result.outputs, result.version),
        headers={"Server-Timing": timing},
        media_type="application/json",
    )
