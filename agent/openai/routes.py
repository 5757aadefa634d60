"""The OpenAI-compatible routes: ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions``, whole or streamed as server-sent events.

A thin adapter over the generative core (:mod:`agent.generative`): it reads and validates the
body, turns it into a :class:`~agent.generative.engine.Generation`, and writes what the stream
yields in OpenAI's shapes (:mod:`agent.openai.shapes`). API keys, the rate limit and readiness
are the agent's (admission runs before any route); errors are answered in OpenAI's shape
(:mod:`agent.openai.errors`). A client that goes away cancels its sequence at once: the
agent's HTTP protocol calls back when a connection is lost, and the sequence leaves the
scheduler before the next step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope

from agent.errors import AgentError, RequestError, ShuttingDownError
from agent.generative.models import GenerativeModels, GenerativeVersion
from agent.generative.streams import CANCELLED, Generation, SequenceStream
from agent.http.connection import REFUSED_KEY
from agent.http.events import EventStream, on_client_gone, sse
from agent.http.transport import read_body
from agent.openai.errors import error_parts, openai_error_response
from agent.openai.schema import ChatRequest, CompletionRequest, parse
from agent.openai.shapes import ChatShape, CompletionShape, Shape
from agent.serving.errors import refusal_reason
from agent.serving.state import ServingState
from runtimes.errors import InferenceFailedError

router = APIRouter(prefix="/v1", tags=["OpenAI"])


def _models(request: Request) -> tuple[ServingState, GenerativeModels]:
    state: ServingState = request.app.state.api
    if state.generative is None:  # the routes are mounted only with generative models
        raise ShuttingDownError("no generative models are served")
    return state, state.generative


@router.get("/models", summary="The generative models served (OpenAI's list)")
async def list_models(request: Request) -> Response:
    _, models = _models(request)
    # GET /v1/models/{model} is TF Serving's path too: agent.api.tfserving answers it
    data = [v.card() for _, v in sorted(models.served.items())]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


@router.post("/completions", summary="Text completion (OpenAI's legacy completions)")
async def completions(request: Request) -> Response:
    return await _serve(request, CompletionRequest)


@router.post("/chat/completions", summary="Chat completion")
async def chat_completions(request: Request) -> Response:
    return await _serve(request, ChatRequest)


async def _serve(request: Request, kind: type[CompletionRequest] | type[ChatRequest]) -> Response:
    try:
        state, models = _models(request)
        if not state.service.accepting:
            raise ShuttingDownError("the agent is shutting down")
        body = parse(await read_body(request, state.settings.max_request_bytes), kind)
        version = models.resolve(body.model)
        prompt = _prompt(body, version)
        window = version.context_length
        if body.max_tokens is not None:
            max_tokens = body.max_tokens
        elif isinstance(body, ChatRequest) and body.max_completion_tokens is not None:
            max_tokens = body.max_completion_tokens
        elif isinstance(body, ChatRequest):
            max_tokens = max(1, window - len(prompt))
        else:
            max_tokens = max(
                1, min(models.settings.default_completion_tokens, window - len(prompt))
            )
        generation = Generation(prompt, body.sampling(max_tokens), body.priority or 1)
        stream = version.engine.submit(generation)
    except (AgentError, ClientDisconnect) as exc:
        return _refuse(request.scope, exc)
    shape: Shape = (ChatShape if isinstance(body, ChatRequest) else CompletionShape)(
        version.model, version.version, body.include_usage
    )
    if body.stream:
        return EventStream(_Events(stream, shape).events(), stream.cancel)
    return await _whole(request.scope, request.receive, stream, shape)


def _prompt(body: CompletionRequest | ChatRequest, version: GenerativeVersion) -> list[int]:
    codec = version.engine.codec
    if isinstance(body, ChatRequest):
        return codec.encode(codec.chat_prompt(body.chat()))
    if isinstance(body.prompt, str):
        return codec.encode(body.prompt)
    if body.prompt and isinstance(body.prompt[0], str):
        return codec.encode(str(body.prompt[0]))
    vocab = version.engine.decoder.shape.vocab
    ids = [int(t) for t in body.prompt]
    if any(not 0 <= t < vocab for t in ids):
        raise RequestError(f"prompt: token ids must be in [0, {vocab})", field="prompt")
    return ids


def _refuse(scope: Scope, exc: Exception) -> Response:
    count = scope.get(REFUSED_KEY)
    reason = refusal_reason(exc)
    if count is not None and reason is not None:
        count(reason)
    return openai_error_response(exc)


async def _whole(scope: Scope, receive: Receive, stream: SequenceStream, shape: Shape) -> Response:
    stop_watching = on_client_gone(scope, receive, stream.cancel)
    text, finish = [], None
    try:
        async for delta in stream:
            text.append(delta.text)
            finish = delta.finish
    finally:
        stop_watching()
        stream.cancel()
    if finish is None:
        return openai_error_response(_unfinished(stream))
    body = shape.whole("".join(text), finish, stream.prompt_tokens, stream.completion_tokens)
    return Response(orjson.dumps(body), media_type="application/json")


class _Events:
    """The SSE events of one stream in OpenAI's chunk shapes."""

    def __init__(self, stream: SequenceStream, shape: Shape) -> None:
        self.stream = stream
        self.shape = shape

    async def events(self) -> AsyncIterator[bytes]:
        shape, stream = self.shape, self.stream
        yield _sse(shape.first())
        async for delta in stream:
            if delta.text:
                yield _sse(shape.chunk(delta.text, None))
            if delta.finish is not None:
                yield _sse(shape.chunk("", delta.finish))
        if stream.error is not None:
            # NOTE: as vLLM does: the status is sent already, so the error is an event
            yield _sse(orjson.loads(error_parts(_unfinished(stream))[2]))
        elif shape.include_usage:
            yield _sse(shape.usage_chunk(stream.prompt_tokens, stream.completion_tokens))
        yield b"data: [DONE]\n\n"


def _unfinished(stream: SequenceStream) -> Exception:
    if stream.error == CANCELLED:  # its client is gone, or the agent is closing
        return ShuttingDownError("the sequence was cancelled")
    return InferenceFailedError(f"the sequence ended unfinished: {stream.error}")


def _sse(payload: dict[str, Any] | None) -> bytes:
    return b"" if payload is None else sse(payload)
