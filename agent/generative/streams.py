"""What a front end hands the engine and reads back: a :class:`Generation` in, a
:class:`SequenceStream` of :class:`Delta` out. Nothing here knows HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum

from agent.generative.sampling import SamplingParams


class FinishReason(StrEnum):
    STOP = "stop"
    """EOS or a stop string."""
    LENGTH = "length"
    """``max_tokens`` reached."""


CANCELLED = "cancelled"
""":attr:`SequenceStream.error` of a sequence cancelled (its client gone, or shutdown)."""


@dataclass(frozen=True)
class Generation:
    """What a front end asks for: prompt tokens and how to choose the next ones."""

    prompt: list[int]
    params: SamplingParams
    priority: int = 1


@dataclass(frozen=True)
class Delta:
    """Text decoded since the last delta; ``finish`` on the last one."""

    text: str
    tokens: int
    finish: FinishReason | None = None


class SequenceStream:
    """A submitted sequence as its front end sees it: deltas as they are decoded, ending with
    one that has a ``finish``, or early with an :attr:`error`."""

    def __init__(self, seq: int, prompt_tokens: int, cancel: Callable[[int], None]) -> None:
        self.id = seq
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.finish: FinishReason | None = None
        self.error: str | None = None
        """Why it ended unfinished: :data:`CANCELLED`, or the model step that failed."""
        self._cancel = cancel
        self._queue: asyncio.Queue[Delta | str] = asyncio.Queue()

    @property
    def ended(self) -> bool:
        """It finished, or ended early, as far as its reader has read."""
        return self.finish is not None or self.error is not None

    async def __aiter__(self) -> AsyncIterator[Delta]:
        while not self.ended:
            item = await self._queue.get()
            if isinstance(item, str):
                self.error = item
                return
            self.finish = item.finish
            yield item

    def cancel(self) -> None:
        """The client is gone: the sequence leaves the scheduler at once, and whoever reads
        the stream sees it end. Nothing happens once it has ended."""
        if not self.ended:
            self._cancel(self.id)

    # -- the engine's side -----------------------------------------------------------------

    def put(self, delta: Delta) -> None:
        self.completion_tokens += delta.tokens
        self._queue.put_nowait(delta)

    def end(self, error: str) -> None:
        self._queue.put_nowait(error)
