"""The OpenAI request bodies this front end accepts, validated into the core's terms.

NOTE: fields and ranges from OpenAI's API reference (platform.openai.com/docs/api-reference/
completions/create and chat/create). A field we do not implement is refused with 400 naming
it, rather than silently ignored: ``n > 1``, ``logprobs``, ``echo``, ``suffix``, ``tools``,
``logit_bias``, a ``response_format`` other than text. ``top_k`` and ``priority`` are vLLM's
extensions (``priority``: 1 runs first, as in the agent's other front ends).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.errors import BadJsonError, RequestError
from agent.generative.sampling import SamplingParams

MAX_STOP_STRINGS = 4
T = TypeVar("T", bound=BaseModel)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: str = Field(min_length=1)
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    n: Literal[1] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**63)] | None = None
    user: str | None = None
    priority: Annotated[int, Field(ge=1, le=16)] | None = None
    logprobs: Literal[False, None] = None
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = None

    def sampling(self, max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            raise RequestError("stop strings must not be empty", field="stop")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(0, self.top_k or 0),
            seed=self.seed,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            stop=tuple(stop),
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | list[int]
    """One prompt: a string (or a list of one), or its token ids."""
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    echo: Literal[False, None] = None
    suffix: None = None
    best_of: Literal[1] | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Body):
    type: Literal["text"]


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Any], Field(max_length=0)] | None = None

    def chat(self) -> list[dict[str, str]]:
        # "developer" is the newer name of "system" (OpenAI's o-series); templates know system
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in self.messages
        ]


def parse(body: bytes, model: type[T]) -> T:
    """Decode and validate a request body.

    Raises:
        BadJsonError: not JSON, or not an object.
        RequestError: the first invalid field, named in ``field`` (``messages.0.role``).
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadJsonError(f"the body is not JSON: {exc}", field="body") from None
    if not isinstance(data, dict):
        raise BadJsonError("the body must be a JSON object", field="body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in error["loc"] if not _is_union_branch(p))
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "this field is not supported"
        raise RequestError(f"{where or 'body'}: {message}", field=where or "body") from None


def _is_union_branch(part: object) -> bool:
    # pydantic names the union member that failed ("str", "list[str]", "literal[1]"...)
    return isinstance(part, str) and (
        part in ("str", "int", "float", "bool", "none")
        or "[" in part
        or part.startswith("function")
    )
