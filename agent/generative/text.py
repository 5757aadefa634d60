"""Text <-> tokens for a generative version: ``tokenizer.json`` (Hugging Face ``tokenizers``)
and the chat template of ``tokenizer_config.json`` (Jinja, in a sandbox, as ``transformers``
renders it). Both packages are the ``generative`` extra's, imported only when a generative
model loads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.errors import LoadError, RequestError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


class TextCodec:
    """Encodes prompts, renders chats, decodes generated tokens."""

    def __init__(self, version_dir: Path) -> None:
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise LoadError(
                f"generative models need the 'generative' extra ({exc.name} is missing): "
                "pip install 'edgefleet[generative]'"
            ) from exc
        try:
            self._tokenizer = Tokenizer.from_file(str(version_dir / TOKENIZER_FILE))
            config = json.loads((version_dir / TOKENIZER_CONFIG).read_text())
        except (OSError, ValueError, Exception) as exc:
            raise LoadError(f"{version_dir}: tokenizer files unusable ({exc})") from exc
        template = config.get("chat_template")
        self._template = (
            ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
                template
            )
            if isinstance(template, str)
            else None
        )
        self._special = {k: config.get(k) for k in ("bos_token", "eos_token")}

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        """The prompt the chat template makes of ``messages``, ending with the assistant's turn.

        Raises:
            RequestError: the model has no chat template (``model``), or it refused the
                messages (``messages``).
        """
        if self._template is None:
            raise RequestError(
                "this model has no chat template: use /v1/completions", field="model"
            )
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=True, **self._special
            )
        except Exception as exc:  # jinja's errors, a template's raise_exception
            raise RequestError(
                f"the chat template refused the messages: {exc}", field="messages"
            ) from exc
