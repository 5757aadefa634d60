"""OpenAI's response objects, whole and streamed, for completions and chat completions.

NOTE: shapes from OpenAI's API reference (the completion, chat completion and chat completion
chunk objects): a stream's first chat chunk carries the assistant role, each later one a
``delta`` of content, the last one ``finish_reason``; with ``stream_options.include_usage``
every chunk has ``usage: null`` and one more chunk with no choices carries the usage.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from agent.generative.streams import FinishReason


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class Shape:
    """The objects of one request; one id and one ``created`` for all its chunks."""

    prefix = ""
    object = ""
    chunk_object = ""

    def __init__(self, model: str, version: int, include_usage: bool) -> None:
        self.model = model
        self.include_usage = include_usage
        self.id = f"{self.prefix}-{secrets.token_hex(12)}"
        self.created = int(time.time())  # a timestamp for clients, not an interval
        self.fingerprint = f"edgefleet-{model}-v{version}"

    def _head(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
        }

    def whole(
        self, text: str, finish: FinishReason, prompt: int, completion: int
    ) -> dict[str, Any]:
        return {
            **self._head(self.object),
            "choices": [{"index": 0, **self._content(text), "finish_reason": finish.value}],
            "usage": usage(prompt, completion),
        }

    def first(self) -> dict[str, Any] | None:
        """A chunk sent before any token (the chat's role), or None."""
        return None

    def chunk(self, text: str, finish: FinishReason | None) -> dict[str, Any]:
        choice = {"index": 0, **self._delta(text), "finish_reason": finish and finish.value}
        out = {**self._head(self.chunk_object), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, prompt: int, completion: int) -> dict[str, Any]:
        return {**self._head(self.chunk_object), "choices": [], "usage": usage(prompt, completion)}

    def _content(self, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def _delta(self, text: str) -> dict[str, Any]:
        raise NotImplementedError


class CompletionShape(Shape):
    prefix = "cmpl"
    object = "text_completion"
    chunk_object = "text_completion"

    def _content(self, text: str) -> dict[str, Any]:
        return {"text": text, "logprobs": None}

    def _delta(self, text: str) -> dict[str, Any]:
        return {"text": text, "logprobs": None}


class ChatShape(Shape):
    prefix = "chatcmpl"
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def _content(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}, "logprobs": None}

    def _delta(self, text: str) -> dict[str, Any]:
        return {"delta": {"content": text} if text else {}, "logprobs": None}

    def first(self) -> dict[str, Any] | None:
        out = self.chunk("", None)
        out["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        return out
