"""The token loop of one generative version: the scheduler's plan, run on the decoder in the
version's own compute thread, one step at a time, and each token handed to its stream.

The loop is a task started by :meth:`Engine.start` and awaited by :meth:`Engine.close`. Each
step: admit and plan (:class:`~agent.generative.scheduler.Scheduler`, on the event loop), run
the plan's prefill chunks and one batched decode call and choose the tokens (in the thread),
then detokenise, check stop strings and publish (on the loop). Where a step has both, the
prefill chunks run as a call of their own and their first tokens are published before the
decode call runs. A sequence cancelled while a
step runs (its client gone) has left the scheduler already; what the step computed for it is
dropped. Nothing here knows HTTP: a front end submits a :class:`Generation` and reads its
:class:`SequenceStream`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from agent.errors import ContextLengthError, RequestError, ShuttingDownError
from agent.generative.decoder import Decoder
from agent.generative.metrics import MODEL_FAILURE, SequenceTimer
from agent.generative.sampling import Sampler, held_back, stop_cut
from agent.generative.scheduler import Chunk, Scheduler, StepPlan
from agent.generative.streams import (
    CANCELLED,
    Delta,
    FinishReason,
    Generation,
    SequenceStream,
)
from agent.generative.text import TextCodec
from agent.inference.priority import lower_this_thread

log = logging.getLogger("edgefleet.agent.generative")


@dataclass
class _Active:
    stream: SequenceStream
    prompt: list[int]
    sampler: Sampler
    timer: SequenceTimer
    generated: list[int] = field(default_factory=list)
    sent: int = 0
    """Characters of the decoded text already published."""


class Engine:
    """Continuous batching over one loaded decoder."""

    _ids = itertools.count(1)

    def __init__(
        self,
        decoder: Decoder,
        codec: TextCodec,
        scheduler: Scheduler,
        *,
        timer: Callable[[int], SequenceTimer],
        nice_offset: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.decoder = decoder
        self.codec = codec
        self.scheduler = scheduler
        self.context_length = decoder.shape.context
        self._timer = timer
        self._clock = clock
        self._active: dict[int, _Active] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.accepting = True
        self.closed = False
        self.steps = 0
        self._executor = ThreadPoolExecutor(
            1,
            thread_name_prefix="generative",
            initializer=lower_this_thread,
            initargs=(nice_offset,),
        )

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def start(self, name: str) -> None:
        self._task = asyncio.create_task(self._run(), name=f"generative-{name}")

    def submit(self, generation: Generation) -> SequenceStream:
        """Queue a sequence; its deltas arrive on the returned stream.

        Raises:
            ContextLengthError: prompt + ``max_tokens`` is over the context window.
            RequestError: the prompt is empty.
            KvBudgetFullError: the KV budget and the wait queue are full.
            ShuttingDownError: this version is being retired.
        """
        if not self.accepting:
            raise ShuttingDownError("this model version is being replaced; retry")
        prompt, params = generation.prompt, generation.params
        window = min(self.context_length, self.scheduler.kv_budget_tokens)
        if len(prompt) + params.max_tokens > window:
            raise ContextLengthError(
                f"this model's context window is {window} tokens; the request asks for "
                f"{len(prompt) + params.max_tokens} ({len(prompt)} in the prompt, "
                f"{params.max_tokens} to generate): shorten the prompt or lower max_tokens",
                field="max_tokens" if len(prompt) < window else "prompt",
            )
        if not prompt:
            raise RequestError("the prompt is empty", field="prompt")
        seq = next(self._ids)
        self.scheduler.submit(
            seq, len(prompt), params.max_tokens, self._clock(), generation.priority
        )
        stream = SequenceStream(seq, len(prompt), self.cancel)
        sampler = Sampler(params, self.decoder.shape.vocab)
        self._active[seq] = _Active(stream, prompt, sampler, self._timer(len(prompt)))
        self._idle.clear()
        self._wake.set()
        return stream

    def cancel(self, seq: int, why: str = CANCELLED, failure: str = "cancelled") -> None:
        """End a sequence before it finishes; its stream ends with ``why`` as its error, and its
        statistics count it as ``failure`` (a client's cancel, or the model's fault)."""
        self.scheduler.cancel(seq)
        active = self._active.pop(seq, None)
        if active is not None:
            active.timer.finished(self._clock(), active.stream.completion_tokens, failure)
            active.stream.end(why)
            self._check_idle()

    async def drain(self) -> None:
        """Take no new sequences; return once those in flight have finished."""
        self.accepting = False
        await self._idle.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for seq in list(self._active):
            self.cancel(seq)
        self._executor.shutdown(wait=True)
        self.decoder.close()
        self.closed = True

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            plan = self.scheduler.plan(self._clock())
            if plan.empty:  # cannot happen with work to do; never spin if it does
                log.error("generative scheduler planned nothing with work waiting")
                self._wake.clear()
                await self._wake.wait()
                continue
            inputs = self._inputs(plan)
            finished: dict[int, FinishReason] = {}
            try:
                if plan.prefill and plan.decode:
                    # first tokens go out before the running rows' decode: a request joining
                    # a busy batch waits for its prefill, not for its prefill and their step
                    first = await loop.run_in_executor(self._executor, self._prefill, plan, inputs)
                    self._publish(first, finished)
                tokens = await loop.run_in_executor(self._executor, self._compute, plan, inputs)
            except Exception as exc:
                log.exception("generative step failed: its sequences are ended")
                for seq in [c.seq for c in plan.prefill] + [s for s, _ in plan.decode]:
                    self.cancel(seq, f"the model step failed: {exc}", MODEL_FAILURE)
                continue
            self.steps += 1
            self._publish(tokens, finished)
            self._advance(plan, finished)

    def _inputs(self, plan: StepPlan) -> dict[int, tuple[list[int], Sampler]]:
        """What the step thread reads of each sequence: its tokens so far and its sampler
        (the loop does not touch them while the step runs)."""
        inputs = {}
        for chunk in plan.prefill:
            active = self._active[chunk.seq]
            inputs[chunk.seq] = (active.prompt[chunk.start : chunk.end], active.sampler)
        for seq, _ in plan.decode:
            active = self._active[seq]
            position = len(active.prompt) + len(active.generated) - 1
            inputs[seq] = ([active.generated[-1], position], active.sampler)
        return inputs

    def _prefill(
        self, plan: StepPlan, inputs: dict[int, tuple[list[int], Sampler]]
    ) -> dict[int, int]:
        """The step thread: the plan's prefill chunks, those of one shape (start and length)
        in one call; the first token of each prompt whose last chunk ran."""
        shapes: dict[tuple[int, int], list[Chunk]] = {}
        for chunk in plan.prefill:
            shapes.setdefault((chunk.start, chunk.end - chunk.start), []).append(chunk)
        chosen = {}
        for (start, _), chunks in shapes.items():
            slots = [chunk.slot for chunk in chunks]
            logits = self.decoder.prefill_rows(slots, [inputs[c.seq][0] for c in chunks], start)
            for row, chunk in enumerate(chunks):
                if chunk.last:
                    chosen[chunk.seq] = inputs[chunk.seq][1].choose(logits[row])
        return chosen

    def _compute(
        self, plan: StepPlan, inputs: dict[int, tuple[list[int], Sampler]]
    ) -> dict[int, int]:
        """The step thread: the decode rows in one call, after the prefill chunks unless
        those ran already (a step with both runs them first, on their own)."""
        chosen = {} if plan.decode else self._prefill(plan, inputs)
        if plan.decode:
            rows = [(slot, inputs[seq][0][0], inputs[seq][0][1]) for seq, slot in plan.decode]
            logits = self.decoder.decode(rows)
            for row, (seq, _) in enumerate(plan.decode):
                chosen[seq] = inputs[seq][1].choose(logits[row])
        return chosen

    def _publish(self, tokens: dict[int, int], finished: dict[int, FinishReason]) -> None:
        """Hand each token to its stream; note in ``finished`` the sequences it ends."""
        now = self._clock()
        for seq, token in tokens.items():
            active = self._active.get(seq)
            if active is None:
                continue  # cancelled while the step ran
            active.timer.token(now)
            reason = self._append(active, token)
            if reason is not None:
                finished[seq] = reason

    def _advance(self, plan: StepPlan, finished: dict[int, FinishReason]) -> None:
        self.scheduler.advance(plan, set(finished))
        for seq in [s for s in self._active if self.scheduler.state(s) is None]:
            self._end(seq, finished.get(seq, FinishReason.LENGTH))

    def _append(self, active: _Active, token: int) -> FinishReason | None:
        """Add ``token`` and publish the text it completes; the reason if it ends the text."""
        stop = active.sampler.params.stop
        if token == self.decoder.shape.eos_token_id:
            self._send(active, self.codec.decode(active.generated), 1)
            return FinishReason.STOP
        active.generated.append(token)
        text = self.codec.decode(active.generated)
        cut = stop_cut(text, stop) if stop else None
        if cut is not None:
            self._send(active, text[:cut], 1)
            return FinishReason.STOP
        self._send(active, text[: len(text) - held_back(text, stop)], 1)
        return None

    def _send(self, active: _Active, text: str, tokens: int) -> None:
        delta = text[active.sent :] if len(text) > active.sent else ""
        active.sent = max(active.sent, len(text))
        if delta or tokens:
            active.stream.put(Delta(delta, tokens))

    def _end(self, seq: int, reason: FinishReason) -> None:
        active = self._active.pop(seq, None)
        self.scheduler.cancel(seq)
        if active is None:
            return
        if reason is FinishReason.LENGTH:  # the held-back tail is text after all
            self._send(active, self.codec.decode(active.generated), 0)
        active.timer.finished(self._clock(), active.stream.completion_tokens)
        active.stream.put(Delta("", 0, reason))
        self._check_idle()

    def _check_idle(self) -> None:
        if not self._active:
            self._idle.set()
