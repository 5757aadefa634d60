"""Settings of generative serving (``[generative]`` in the agent's file,
``EDGEFLEET_AGENT_GENERATIVE__*`` in the environment)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GenerativeSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_sequences: int = Field(default=16, ge=1, le=256)
    """Sequences decoding at once (the cache's slots): every step decodes one token for each
    in one batched call."""
    kv_cache_tokens: int | None = Field(default=None, ge=1)
    """The KV-cache budget in tokens, over all running sequences; each is admitted with its
    prompt plus ``max_tokens`` reserved. None: ``max_sequences`` full contexts, or what a
    quarter of the hardware profile's memory budget holds if that is less."""
    max_waiting_sequences: int = Field(default=64, ge=0)
    """Sequences that may wait for room; beyond that a request gets 429 with Retry-After."""
    prefill_chunk_tokens: int = Field(default=32, ge=1)
    """Prompt tokens prefilled in one chunk; a longer prompt takes one chunk per step, so the
    running streams keep their pace."""
    prefill_chunks_per_step: int = Field(default=4, ge=1)
    """Chunks (of different sequences) prefilled in one step, oldest first; chunks of one
    shape (the same start and length, as prompts arriving together often have) run in one
    call."""
    default_completion_tokens: int = Field(default=16, ge=1)
    """``max_tokens`` of a completion that gives none (OpenAI's default); a chat completion
    without it may fill the context."""
