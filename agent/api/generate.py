"""Triton's generate extension over the generative core: ``POST /v2/models/{m}/generate`` (one
JSON answer) and ``generate_stream`` (server-sent events), for Triton users.

NOTE: extension spec (provisional in Triton):
https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_generate.md
The body's fields other than ``parameters`` name the model's inputs: ``text_input``, and, as
TensorRT-LLM's ensemble takes them, ``max_tokens``, ``stop_words`` and ``bad_words`` (empty
only); sampling goes in ``parameters`` (``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
``seed``, ``stop``, ``presence_penalty``, ``frequency_penalty``, ``priority``), as the vLLM
backend reads them. Errors are the V2 shape, ``{"error": "..."}``, also within a stream.
Mounted only when generative models are served (:func:`agent.api.app.create_app`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from agent.errors import BadJsonError, ModelNotFoundError, RequestError, ShuttingDownError
from agent.generative.models import GenerativeVersion
from agent.generative.sampling import SamplingParams
from agent.generative.streams import CANCELLED, Generation, SequenceStream
from agent.http.events import EventStream, on_client_gone, sse
from agent.http.transport import json_response, read_body
from agent.serving.state import ServingState
from runtimes.errors import InferenceFailedError

router = APIRouter(tags=["Generate (Triton extension)"])

DEFAULT_MAX_TOKENS = 16
_TYPES = frozenset({"str", "int", "float", "bool", "none"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GenerateParameters(_Strict):
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    seed: Annotated[int, Field(ge=-(2**63), lt=2**63)] | None = None
    stop: list[Annotated[str, Field(min_length=1)]] = []
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    priority: Annotated[int, Field(ge=1, le=16)] = 1
    stream: bool | None = None
    """Ignored: the URL says whether the answer streams."""


class GenerateRequest(_Strict):
    text_input: Annotated[str, Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stop_words: str | list[str] | None = None
    bad_words: Literal["", None] | list[str] = None
    stream: bool | None = None
    parameters: GenerateParameters = GenerateParameters()

    def sampling(self, max_tokens: int) -> SamplingParams:
        p = self.parameters
        words = [self.stop_words] if isinstance(self.stop_words, str) else self.stop_words or []
        if self.bad_words:
            raise RequestError("bad_words: not supported", field="bad_words")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            seed=p.seed,
            presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty,
            stop=tuple(s for s in [*p.stop, *words] if s),
        )


@router.post("/v2/models/{model_name}/generate", summary="Generate text (one answer)")
@router.post("/v2/models/{model_name}/versions/{model_version}/generate", summary="Generate text")
async def generate(request: Request, model_name: str, model_version: str = "") -> Response:
    version, stream = await _start(request, model_name, model_version)
    stop_watching = on_client_gone(request.scope, request.receive, stream.cancel)
    text = []
    try:
        async for delta in stream:
            text.append(delta.text)
    finally:
        stop_watching()
        stream.cancel()
    _raise_if_unfinished(stream)
    return json_response(_answer(version, "".join(text)))


@router.post(
    "/v2/models/{model_name}/generate_stream", summary="Generate text as server-sent events"
)
@router.post(
    "/v2/models/{model_name}/versions/{model_version}/generate_stream",
    summary="Generate text as server-sent events",
)
async def generate_stream(request: Request, model_name: str, model_version: str = "") -> Response:
    version, stream = await _start(request, model_name, model_version)
    return EventStream(_events(version, stream), stream.cancel)


async def _events(version: GenerativeVersion, stream: SequenceStream) -> AsyncIterator[bytes]:
    async for delta in stream:
        if delta.text:
            yield sse(_answer(version, delta.text))
    if stream.error is not None:
        yield sse({"error": f"the sequence ended unfinished: {stream.error}"})


def _raise_if_unfinished(stream: SequenceStream) -> None:
    if stream.error == CANCELLED:  # its client is gone, or the agent is closing
        raise ShuttingDownError("the sequence was cancelled")
    if stream.error is not None:
        raise InferenceFailedError(stream.error)


def _answer(version: GenerativeVersion, text: str) -> dict[str, str]:
    return {"model_name": version.model, "model_version": str(version.version), "text_output": text}


async def _start(
    request: Request, model: str, version_name: str
) -> tuple[GenerativeVersion, SequenceStream]:
    state: ServingState = request.app.state.api
    if state.generative is None or not state.service.accepting:
        raise ShuttingDownError("generative models are not served now")
    body = _parse(await read_body(request, state.settings.max_request_bytes))
    version = state.generative.resolve(model)
    if version_name and version_name != str(version.version):
        raise ModelNotFoundError(
            f"model {model!r} serves version {version.version}, not {version_name!r}",
            field="model_version",
        )
    engine = version.engine
    prompt = engine.codec.encode(body.text_input)
    limit = body.parameters.max_tokens or body.max_tokens
    if limit is None:
        limit = max(1, min(DEFAULT_MAX_TOKENS, version.context_length - len(prompt)))
    generation = Generation(prompt, body.sampling(limit), body.parameters.priority)
    return version, engine.submit(generation)


def _parse(body: bytes) -> GenerateRequest:
    try:
        return GenerateRequest.model_validate_json(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        if error["type"] == "json_invalid":
            raise BadJsonError(f"the body is not JSON: {error['msg']}", field="body") from None
        # pydantic names a union's failed member too ("str", "list[str]"): not a field
        where = ".".join(
            str(p) for p in error["loc"] if not (isinstance(p, str) and (p in _TYPES or "[" in p))
        )
        raise RequestError(f"{where}: {error['msg']}", field=where or "body") from None
