"""The dynamic batcher of one model version.

Requests wait in a bounded queue as decoded numpy arrays. When an executor instance is free,
the scheduler takes the oldest request of the highest priority and adds the following requests
whose non-batch shape matches, up to ``max_batch_size`` rows. The batch runs at once if it is
full or of a preferred size, or once the oldest request has waited ``max_queue_delay_us``;
otherwise the scheduler waits for more. Batches form only when an instance is free, so under
load they grow by themselves (Triton forms batches the same way).

How batches form and balance: the batcher's :class:`~agent.inference.batch_former.BatchFormer`,
which holds the queues and the batches out; the batcher holds the threads, the event loop's
timer and the answers.

Each instance has a thread of its own; formed batches go to a queue the threads share, and
the first free thread takes the next. Besides one batch per instance, one full batch (a request,
without batching) may wait in that queue, so that an instance that finishes starts again at
once instead of waiting for the event loop to hear of it and hand it more work. Such a batch is
taken back into the queues if a request of a higher priority comes, if one of its requests
times out or is given up, or when the batcher closes, as long as no thread has started it.

Outputs are split back by rows after checking each output has the summed row count; a batch
whose outputs do not (a model whose first dimension is dynamic but not the batch) is run again
one request at a time, as a failing batch is.

A failing batch fails only its own requests, and of those only the ones at fault: some
failures depend on one request's data and show only when the model runs (an index past an
embedding table, a string that is not UTF-8), so a batch of several requests that fails that
way is run again one request at a time (:mod:`agent.inference.batch_run`). A request that times
out in the queue is answered with :class:`DeadlineExceededError` and never run; one whose caller
went away (its future cancelled) is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from queue import SimpleQueue

from agent.errors import OverloadedError, ShuttingDownError
from agent.inference.batch_former import Arrays, Batch, BatchFormer, Item, shape_key
from agent.inference.batch_run import ItemResult, Ran, joined, run_batch
from agent.inference.priority import lower_this_thread
from common.model_config import BatchingConfig
from runtimes.base import Runtime
from runtimes.errors import InferenceFailedError, RuntimeFailure

QUEUED_BATCHES = 1
"""Full batches handed to the instances' threads beyond one per instance, for the first thread
that finishes: without one, an instance that finished waited for the event loop to notice,
form its next batch and hand it over, a while when the loop is receiving a 600 KB request.
Only a full batch (a request, without batching) is queued so: under load batches still grow
while every instance computes."""

INLINE_MAX_S = 0.0005
"""A lone request (nothing else queued or running) whose shapes ran in less than this is run
on the event loop, not handed to an instance's thread: the hand-off there and back (a thread
woken, then the loop) cost ``mlp`` (0.1 ms) about a fifth of its round trip at one client,
where a hand-written endpoint calls the session on its loop. A longer run would hold up the
requests the loop reads meanwhile, and under load requests queue, and batches go to threads."""
MAX_SHAPES_TIMED = 64
"""Shapes whose lone compute time is remembered (for running on the event loop)."""

log = logging.getLogger("edgefleet.agent.batcher")


BatchObserver = Callable[[int, float, float, float], None]
"""Called after every executed batch with (rows, seconds in the backend, seconds stacking its
inputs, seconds splitting its outputs)."""


class Batcher:
    def __init__(
        self,
        name: str,
        runtimes: Sequence[Runtime],
        config: BatchingConfig,
        *,
        batched: bool,
        observer: BatchObserver | None = None,
        nice_offset: int = 0,
        inline_max_s: float = 0.0,
    ) -> None:
        """``nice_offset``: the instances' threads run that many nice steps below the event
        loop (:mod:`agent.inference.priority`). ``inline_max_s``: a lone request whose shape
        ran in less than this (measured) is run on the event loop when nothing else is
        queued or running (0: never)."""
        self.name = name
        self.config = config
        self._runtimes = list(runtimes)
        self.former = BatchFormer(
            name,
            config,
            batched=batched,
            instances=len(self._runtimes),
            slots=len(self._runtimes) + QUEUED_BATCHES,
        )
        """The queues and the batches out, and the decisions over them."""
        self.batched = self.former.batched
        self.max_rows = self.former.max_rows
        self._nice_offset = nice_offset
        self._work: SimpleQueue[Batch | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._observer = observer
        self._poked = False
        """A scheduling pass is due in this turn of the event loop (:meth:`_poke`)."""
        self._wake: asyncio.TimerHandle | None = None
        """The next pass nothing else would start: a batching delay, a hold, a deadline."""
        self._wake_at = 0.0
        """When ``_wake`` is due (``time.monotonic``; the loop's own clock may differ)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._all_answered = asyncio.Event()
        self._all_answered.set()
        self._closed = False
        self._rerun_batches = 0
        self._inline_max_s = inline_max_s
        self._alone_s: dict[tuple[object, ...], float] = {}
        """Smoothed compute seconds of a lone request, by its shapes (:func:`shape_key`)."""

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._threads = [
            threading.Thread(
                target=self._serve, args=(runtime,), name=f"{self.name}-{i}", daemon=True
            )
            for i, runtime in enumerate(self._runtimes)
        ]
        for thread in self._threads:
            thread.start()

    async def drain(self) -> None:
        """Wait until nothing is queued or running."""
        await self._idle.wait()

    async def close(self) -> None:
        """Fail whatever still waits, wait for running batches, release executors and runtimes."""
        self._closed = True
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        # batches no thread has started fail as waiting requests do
        self.former.fail_queued(lambda: ShuttingDownError(f"{self.name} was unloaded"))
        self._update_answered()
        await self._all_answered.wait()  # a batch a thread has started runs to its end
        if self._threads:
            for _ in self._threads:  # each thread closes its runtime after its last batch
                self._work.put(None)
        else:
            for runtime in self._runtimes:
                runtime.close()
        self._idle.set()

    @property
    def pending(self) -> int:
        """Requests waiting: queued, or in a batch no thread has started."""
        return self.former.pending

    @property
    def running(self) -> int:
        """Batches started and not answered yet."""
        return self.former.running

    @property
    def rerun_batches(self) -> int:
        """Batches that failed and were run again one request at a time
        (:func:`agent.inference.batch_run.run_batch`)."""
        return self._rerun_batches

    # -- submission -----------------------------------------------------------------------

    async def infer(
        self, inputs: Arrays, rows: int, *, priority: int, timeout_s: float | None
    ) -> ItemResult:
        """Queue a (validated) request and wait for its result (:meth:`submit`)."""
        future = self.submit(inputs, rows, priority=priority, timeout_s=timeout_s)
        try:
            return await future
        except BaseException:
            self.cancel(future)
            raise

    def cancel(self, future: asyncio.Future[ItemResult]) -> None:
        """Give up on a request :meth:`submit` queued: dropped if it has not run yet."""
        future.cancel()
        self._given_up()

    def _given_up(self) -> None:
        self.former.given_up()
        self._poke()

    def submit(
        self, inputs: Arrays, rows: int, *, priority: int, timeout_s: float | None
    ) -> asyncio.Future[ItemResult]:
        """Queue a (validated) request, splitting it if it has more rows than a batch holds.
        Cancelling the future drops what has not run yet."""
        if rows <= self.max_rows or not self.batched:
            return self._submit(inputs, rows, priority, timeout_s)
        pieces = range(0, rows, self.max_rows)
        if self.pending + len(pieces) > self.config.max_queue_size:
            raise self._overloaded()
        futures = [
            self._submit(
                {k: v[s : s + self.max_rows] for k, v in inputs.items()},
                min(self.max_rows, rows - s),
                priority,
                timeout_s,
            )
            for s in pieces
        ]
        return joined(futures, self._given_up)

    def _submit(
        self, inputs: Arrays, rows: int, priority: int, timeout_s: float | None
    ) -> asyncio.Future[ItemResult]:
        if self._closed:
            raise ShuttingDownError(f"{self.name} is unloading")
        if self.pending >= self.config.max_queue_size:
            raise self._overloaded()
        now = time.monotonic()
        assert self._loop is not None, "start() the batcher first"
        item = Item(
            inputs,
            rows,
            shape_key(inputs, self.batched),
            priority,
            now + timeout_s if timeout_s else None,
            now,
            self._loop.create_future(),
        )
        self.former.enqueue(item)
        self._update_answered()  # it may have taken back a batch of a lower priority
        self._idle.clear()
        self._poke()
        return item.future

    def _overloaded(self) -> OverloadedError:
        return OverloadedError(
            f"model {self.name}: queue is full ({self.config.max_queue_size} requests waiting)",
            retry_after_s=self.former.retry_after_s(),
        )

    # -- scheduling -----------------------------------------------------------------------

    def _poke(self) -> None:
        """Have a scheduling pass run soon, once however many requests come in this turn of the
        event loop (:meth:`_pass`), so that those read together can batch together."""
        if not self._poked and self._loop is not None:
            self._poked = True
            self._loop.call_soon(self._pass)

    def _pass(self) -> None:
        """Expire, form batches while an instance (or the queue behind them) is free, and
        arm a timer for the next thing that must happen without a request or a finished
        batch to prompt it: a batching delay, a hold, a queue deadline."""
        self._poked = False
        if self._closed:
            return
        now = time.monotonic()
        self.former.expire(now)
        self._update_answered()
        while self.former.has_room and (items := self.former.form(now)) is not None:
            self._dispatch(items)
        self._update_idle()
        wake_at = self.former.next_wake()
        if self._wake is not None:
            if wake_at == self._wake_at:
                return
            self._wake.cancel()
            self._wake = None
        if wake_at is not None:
            assert self._loop is not None  # poked
            self._wake = self._loop.call_later(max(wake_at - now, 0), self._woken)
            self._wake_at = wake_at

    def _woken(self) -> None:
        self._wake = None
        self._pass()

    def _dispatch(self, items: list[Item]) -> None:
        """Hand the batch to the instances' threads: the first one free takes it; a lone
        request of a model of microseconds runs on the event loop instead."""
        batch = self.former.batch_of(items)
        if batch is None:
            return
        if (
            len(items) == 1  # without batching, every time
            and self.former.busy == 0
            and self.former.queued == 0
            and self._alone_s.get(items[0].key, math.inf) < self._inline_max_s
        ):
            self._run_inline(batch)
            return
        self.former.hand_out(batch)
        self._all_answered.clear()
        self._work.put(batch)

    def _update_idle(self) -> None:
        if self.former.idle:
            self._idle.set()

    def _update_answered(self) -> None:
        if self.former.all_answered:
            self._all_answered.set()

    # -- execution ------------------------------------------------------------------------

    def _serve(self, runtime: Runtime) -> None:
        """An instance's thread: claim the batches queued, run each and hand it back to the
        event loop, close the runtime at the end. A thread that finishes claims the next batch
        queued at once, without waiting for the loop."""
        lower_this_thread(self._nice_offset)
        while (batch := self._work.get()) is not None:
            if not self.former.claim(batch):
                continue
            self._run(batch, runtime)
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self._finished, batch)
            except RuntimeError:  # the event loop is closed: nobody waits for an answer
                break
        try:
            runtime.close()
        except Exception as exc:  # a backend failing to close must not end the thread silently
            log.warning("an inference instance did not close", extra={"error": repr(exc)})

    def _run(self, batch: Batch, runtime: Runtime) -> None:
        batch.started = time.monotonic()
        try:
            batch.ran = run_batch(
                self.name, runtime, [i.inputs for i in batch.items], [i.rows for i in batch.items]
            )
        except Exception as exc:  # run_batch answers every error; this is a bug of ours
            error = InferenceFailedError(f"{self.name}: {exc!r}")
            batch.ran = Ran(
                [error] * len(batch.items), [(batch.rows, time.monotonic() - batch.started)]
            )
        batch.compute_s = time.monotonic() - batch.started

    def _run_inline(self, batch: Batch) -> None:
        """Run a lone request on the event loop: for a model of microseconds, the hand-off to
        a thread and back (two wake-ups) costs more than the model."""
        self.former.hand_out(batch)
        self.former.claim(batch)
        self._all_answered.clear()
        self._run(batch, self._runtimes[0])
        self._finished(batch)

    def _finished(self, batch: Batch) -> None:
        """A thread ran ``batch``: the next one starts before its answers are written, which
        go out in dispatch order with ``preserve_ordering``."""
        ran = batch.ran
        assert ran is not None
        self.former.ran(batch)
        if self._inline_max_s and len(batch.items) == 1:
            self._learn_alone(batch.items[0].key, batch.compute_s)
        if len(ran.runs) > 1:
            self._rerun_batches += 1
        if self._observer is not None:
            copies = (ran.input_s, ran.output_s)
            for run_rows, run_s in ran.runs:  # a batch run again counts every execution
                self._observer(run_rows, run_s, *copies)
                copies = (0.0, 0.0)  # the runs alone copy nothing
        self._start_next()  # before the answers: the instance is free now
        for answered in self.former.answered(batch):
            self._deliver(answered)
        self._update_answered()
        self._update_idle()
        if self.former.queued:  # a hold to time, another batch to form
            self._poke()

    def _start_next(self) -> None:
        if self._closed or not self.former.has_room:
            return
        items = self.former.form(time.monotonic())
        if items is not None:
            self._dispatch(items)

    def _deliver(self, batch: Batch) -> None:
        ran = batch.ran
        assert ran is not None
        alone = len(ran.runs) > 1  # run again one by one: each request's batch was itself
        for item, result in zip(batch.items, ran.results, strict=True):
            if item.future.done():  # given up on while it ran: nobody to answer
                continue
            if isinstance(result, RuntimeFailure):
                item.future.set_exception(result)
                continue
            batch_rows = item.rows if alone else batch.rows
            item.future.set_result(
                ItemResult(
                    result,
                    batch.started - item.enqueued,
                    batch.compute_s,
                    batch_rows,
                    ran.input_s,
                    ran.output_s,
                )
            )

    def _learn_alone(self, key: tuple[object, ...], compute_s: float) -> None:
        known = self._alone_s.get(key)
        if known is None and len(self._alone_s) >= MAX_SHAPES_TIMED:
            self._alone_s.clear()  # dynamic shapes without end: start again
        self._alone_s[key] = compute_s if known is None else known + 0.2 * (compute_s - known)
