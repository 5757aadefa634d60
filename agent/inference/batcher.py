"""The dynamic batcher of one model version.

Requests wait in a bounded queue as decoded numpy arrays. When an executor instance is free,
the scheduler takes the oldest request of the highest priority and adds the following requests
whose non-batch shape matches, up to ``max_batch_size`` rows. The batch runs at once if it is
full or of a preferred size, or once the oldest request has waited ``max_queue_delay_us``;
otherwise the scheduler waits for more. Batches form only when an instance is free, so under
load they grow by themselves (Triton forms batches the same way).

Without a queue delay, a closed loop of clients does not settle into equal batches by itself:
with 8 clients, a request answered early comes back while the other 7 compute, is alone in the
queue when the instance frees, and runs alone; the 7 return during its short run and run
together, and so on (batches of 1 and 7 instead of 4 and 4, each less efficient). Holding a
lone request until everyone is back is no better: one batch of 8 leaves the instance idle while
its answers and the next requests cross HTTP. So, with ``balance_batches``, when an instance
frees the scheduler aims at half of the rows queued plus those of the batch that just finished
(in a closed loop, half of the clients): it waits for that many rows, for at most a quarter of
the average batch's compute time and never more than ``MAX_HOLD_S``, and takes no more than
that many unless the batch would be full. Two groups then alternate, one computing while the
other crosses HTTP. With steady light load the aim is what is queued and nothing waits; after
a real drop in load one request is held once.

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
from dataclasses import dataclass, field
from queue import SimpleQueue

import numpy as np

from agent.errors import DeadlineExceededError, OverloadedError, ShuttingDownError
from agent.inference.batch_run import ItemResult, Ran, joined, run_batch
from agent.inference.priority import lower_this_thread
from common.model_config import BatchingConfig
from runtimes.base import Runtime
from runtimes.errors import InferenceFailedError, RuntimeFailure

Arrays = dict[str, np.ndarray]

MAX_HOLD_S = 0.02
"""Longest an undersized batch is held for balance, whatever the model's compute time."""
HOLD_FRACTION = 0.25
"""The hold as a fraction of the average batch's compute time: the most the instance idles."""
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


BatchObserver = Callable[[int, float], None]
"""Called after every executed batch with (rows, compute seconds)."""


@dataclass(eq=False)
class _Item:
    inputs: Arrays
    rows: int
    key: tuple[object, ...]
    priority: int
    deadline: float | None
    enqueued: float
    future: asyncio.Future[ItemResult] = field(repr=False)


_QUEUED, _STARTED, _WITHDRAWN = 0, 1, 2


@dataclass(eq=False)
class _Batch:
    """A batch handed to the instances' threads. A thread claims a queued one (``state``, under
    the batcher's lock) and sets ``started``, ``ran`` and ``compute_s`` before handing it back
    to the event loop; the loop may withdraw one no thread has claimed."""

    items: list[_Item]
    rows: int
    state: int = _QUEUED
    started: float = 0.0
    ran: Ran | None = None
    compute_s: float = 0.0


def shape_key(inputs: Arrays, batched: bool) -> tuple[object, ...]:
    """Requests share a batch only if every input's non-batch shape and dtype agree."""
    skip = 1 if batched else 0
    return tuple((name, a.shape[skip:], a.dtype.str) for name, a in sorted(inputs.items()))


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
        self.batched = batched and config.max_batch_size > 0
        self.max_rows = config.max_batch_size if self.batched else 1
        self._runtimes = list(runtimes)
        self._nice_offset = nice_offset
        self._work: SimpleQueue[_Batch | None] = SimpleQueue()
        self._claim = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._observer = observer
        self._queues: list[list[_Item]] = [[] for _ in range(config.priority_levels)]
        self._pending = 0
        self._dispatched: list[_Batch] = []
        """Batches handed to the threads and not answered yet, in the order they were."""
        self._ran_early: set[_Batch] = set()
        """With ``preserve_ordering``: batches run, waiting for an earlier one to finish."""
        self._busy = 0
        """Batches handed to the threads and not run yet."""
        self._slots = len(self._runtimes) + QUEUED_BATCHES
        self._poked = False
        """A scheduling pass is due in this turn of the event loop (:meth:`_poke`)."""
        self._wake: asyncio.TimerHandle | None = None
        """The next pass nothing else would start: a batching delay, a hold, a deadline."""
        self._wake_at = 0.0
        """When ``_wake`` is due (``time.monotonic``; the loop's own clock may differ)."""
        self._timed = 0
        """Requests with a queue deadline and no answer yet: while there are none, a pass looks
        for neither expired requests nor the next deadline."""
        self._gone = False
        """A request was given up since the last pass: a pass drops what was."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._all_answered = asyncio.Event()
        self._all_answered.set()
        self._closed = False
        # Smoothed cost of a batch, for an honest Retry-After.
        self._batch_s = 0.01
        self._rows_per_batch = 1.0
        self._last_rows = 0
        self._hold_until: float | None = None
        self._hold_rows = 0
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
        self._withdraw()  # batches no thread has started fail as waiting requests do
        for queue in self._queues:
            for item in queue:
                if not item.future.done():
                    item.future.set_exception(ShuttingDownError(f"{self.name} was unloaded"))
            queue.clear()
        self._pending = 0
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
        waiting = self._pending
        for batch in self._dispatched:
            if batch.state == _QUEUED:
                waiting += len(batch.items)
        return waiting

    @property
    def running(self) -> int:
        """Batches started and not answered yet."""
        return sum(1 for b in self._dispatched if b.state == _STARTED)

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
        self._gone = True
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
        item = _Item(
            inputs,
            rows,
            shape_key(inputs, self.batched),
            priority,
            now + timeout_s if timeout_s else None,
            now,
            self._loop.create_future(),
        )
        if item.deadline is not None:
            self._timed += 1
            item.future.add_done_callback(self._untimed)
        self._queues[priority - 1].append(item)
        self._pending += 1
        if len(self._queues) > 1 and any(
            b.state == _QUEUED and any(i.priority > priority for i in b.items)
            for b in self._dispatched
        ):
            self._withdraw()  # this request goes first
        self._idle.clear()
        self._poke()
        return item.future

    def _untimed(self, _: asyncio.Future[ItemResult]) -> None:
        self._timed -= 1

    def _overloaded(self) -> OverloadedError:
        rows_per_s = len(self._runtimes) * self._rows_per_batch / max(self._batch_s, 1e-6)
        queued_rows = sum(i.rows for q in self._queues for i in q)
        retry = max(1, math.ceil(queued_rows / max(rows_per_s, 1e-6)))
        return OverloadedError(
            f"model {self.name}: queue is full ({self.config.max_queue_size} requests waiting)",
            retry_after_s=retry,
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
        if self._timed or self._gone:
            self._expire(now)
        while self._busy < self._slots and (batch := self._form_batch(now)) is not None:
            self._dispatch(batch)
        self._update_idle()
        wake_at = self._next_wake()
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

    def _dispatch(self, items: list[_Item]) -> None:
        """Hand the batch to the instances' threads: the first one free takes it."""
        if len(items) == 1:  # without batching, every time
            if items[0].future.done():
                return
            batch = _Batch(items, items[0].rows)
            if (
                self._busy == 0
                and self._pending == 0
                and self._alone_s.get(items[0].key, math.inf) < self._inline_max_s
            ):
                self._run_inline(batch)
                return
        else:
            live = [i for i in items if not i.future.done()]
            if not live:
                return
            batch = _Batch(live, sum(i.rows for i in live))
        self._dispatched.append(batch)
        self._busy += 1
        self._all_answered.clear()
        self._work.put(batch)

    def _withdraw(self) -> None:
        """Take back the batches no thread has started: their requests wait in the queues
        again, in their order (a request of a higher priority came, one of theirs timed out or
        was given up, or the batcher closes)."""
        back: list[_Batch] = []
        with self._claim:
            for batch in self._dispatched:
                if batch.state == _QUEUED:
                    batch.state = _WITHDRAWN
                    back.append(batch)
        if not back:
            return
        for batch in back:
            self._dispatched.remove(batch)
            self._busy -= 1
            for item in batch.items:
                self._queues[item.priority - 1].append(item)
                self._pending += 1
        for level, queue in enumerate(self._queues):
            self._queues[level] = sorted(queue, key=lambda i: i.enqueued)
        if not self._dispatched:
            self._all_answered.set()

    def _update_idle(self) -> None:
        if self._pending == 0 and not self._dispatched:
            self._idle.set()

    def _form_batch(self, now: float) -> list[_Item] | None:
        """The batch to run now, or None to wait for more requests (or for none at all)."""
        head = self._head()
        if head is None:
            self._hold_until = None
            return None
        candidates = self._candidates(head)
        rows = sum(i.rows for i in candidates)
        take: list[_Item] | None = None
        if not self.batched or rows >= self.max_rows:
            take = candidates
        elif self._busy >= len(self._runtimes):  # queued behind the running ones: full only
            return None
        elif (preferred := self._preferred_prefix(candidates)) is not None:
            take = preferred
        elif self.config.max_queue_delay_us:
            if now >= head.enqueued + self.config.max_queue_delay_us / 1e6:
                take = candidates
        elif self.config.balance_batches:
            aim, until = self._aim(rows, now)
            if rows >= aim or now >= until:
                take = self._prefix(candidates, aim)
        else:
            take = candidates
        if take is not None:
            self._hold_until = None
            self._remove(take)
        return take

    def _aim(self, rows: int, now: float) -> tuple[int, float]:
        """The batch size ``balance_batches`` aims at: half of the ``rows`` queued and those
        of the batch that just finished, both as first seen with an instance free; the hold's
        deadline is fixed then too."""
        if self._hold_until is None:
            self._hold_rows = max(1, (rows + self._last_rows + 1) // 2)
            self._hold_until = now + min(HOLD_FRACTION * self._batch_s, MAX_HOLD_S)
        return self._hold_rows, self._hold_until

    @staticmethod
    def _prefix(candidates: list[_Item], rows: int) -> list[_Item]:
        """The leading candidates holding at most ``rows`` rows (the first one at least)."""
        total = 0
        for n, item in enumerate(candidates):
            total += item.rows
            if total > rows:
                return candidates[: max(n, 1)]
        return candidates

    def _next_wake(self) -> float | None:
        """When the scheduler must look again without being prompted: the oldest request's
        batching delay or hold (if an instance is free) or the earliest queue deadline."""
        if not self._timed and (
            self._hold_until is None
            and not self.config.max_queue_delay_us
            or self._busy >= len(self._runtimes)
        ):
            return None
        times: list[float] = []
        if self._timed:
            times += [i.deadline for q in self._queues for i in q if i.deadline is not None]
            times += [
                i.deadline
                for b in self._dispatched
                if b.state == _QUEUED
                for i in b.items
                if i.deadline is not None
            ]
        head = self._head()
        if head is not None and self._busy < len(self._runtimes):
            if self.config.max_queue_delay_us:
                times.append(head.enqueued + self.config.max_queue_delay_us / 1e6)
            elif self._hold_until is not None:
                times.append(self._hold_until)
        return min(times) if times else None

    def _head(self) -> _Item | None:
        """The oldest request of the highest priority."""
        for queue in self._queues:
            if queue:
                return queue[0]
        return None

    def _candidates(self, head: _Item) -> list[_Item]:
        """The head and the requests after it (by priority, then age) that fit with it."""
        chosen, rows = [head], head.rows
        if not self.batched:
            return chosen
        for queue in self._queues:
            for item in queue:
                if item is head or item.key != head.key:
                    continue
                if rows + item.rows > self.max_rows:
                    return chosen
                chosen.append(item)
                rows += item.rows
        return chosen

    def _preferred_prefix(self, candidates: list[_Item]) -> list[_Item] | None:
        preferred = set(self.config.preferred_batch_sizes)
        if not preferred:
            return None
        best, rows = None, 0
        for n, item in enumerate(candidates, 1):
            rows += item.rows
            if rows in preferred:
                best = candidates[:n]
        return best

    def _remove(self, items: list[_Item]) -> None:
        queue = self._queues[items[0].priority - 1]
        n = len(items)
        if queue[:n] == items:  # the oldest of one level (_Item compares by identity)
            del queue[:n]
            self._pending -= n
            return
        taken = {id(i) for i in items}
        for level, queue in enumerate(self._queues):
            if any(id(i) in taken for i in queue):
                self._queues[level] = [i for i in queue if id(i) not in taken]
        self._pending -= len(items)

    def _expire(self, now: float) -> None:
        """Answer requests past their deadline and drop those whose caller went away; a batch
        no thread has started that holds one is taken back first."""
        self._gone = False
        if any(
            b.state == _QUEUED
            and any(
                i.future.done() or (i.deadline is not None and now >= i.deadline) for i in b.items
            )
            for b in self._dispatched
        ):
            self._withdraw()
        for level, queue in enumerate(self._queues):
            keep = []
            for item in queue:
                if item.future.cancelled():
                    continue
                if item.deadline is not None and now >= item.deadline:
                    waited_ms = 1000 * (now - item.enqueued)
                    item.future.set_exception(
                        DeadlineExceededError(
                            f"model {self.name}: request waited {waited_ms:.1f} ms in the queue, "
                            f"past its timeout of {1000 * (item.deadline - item.enqueued):.1f} ms; "
                            "it was not run"
                        )
                    )
                    continue
                keep.append(item)
            if len(keep) != len(queue):
                self._pending -= len(queue) - len(keep)
                self._queues[level] = keep

    # -- execution ------------------------------------------------------------------------

    def _serve(self, runtime: Runtime) -> None:
        """An instance's thread: claim the batches queued, run each and hand it back to the
        event loop, close the runtime at the end. A thread that finishes claims the next batch
        queued at once, without waiting for the loop."""
        lower_this_thread(self._nice_offset)
        while (batch := self._work.get()) is not None:
            with self._claim:
                if batch.state == _WITHDRAWN:
                    continue
                batch.state = _STARTED
            batch.started = time.monotonic()
            try:
                batch.ran = run_batch(
                    self.name,
                    runtime,
                    [i.inputs for i in batch.items],
                    [i.rows for i in batch.items],
                )
            except Exception as exc:  # run_batch answers every error; this is a bug of ours
                error = InferenceFailedError(f"{self.name}: {exc!r}")
                batch.ran = Ran(
                    [error] * len(batch.items), [(batch.rows, time.monotonic() - batch.started)]
                )
            batch.compute_s = time.monotonic() - batch.started
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self._finished, batch)
            except RuntimeError:  # the event loop is closed: nobody waits for an answer
                break
        try:
            runtime.close()
        except Exception as exc:  # a backend failing to close must not end the thread silently
            log.warning("an inference instance did not close", extra={"error": repr(exc)})

    def _run_inline(self, batch: _Batch) -> None:
        """Run a lone request on the event loop: for a model of microseconds, the hand-off to
        a thread and back (two wake-ups) costs more than the model."""
        self._dispatched.append(batch)
        self._busy += 1
        self._all_answered.clear()
        batch.state = _STARTED
        batch.started = time.monotonic()
        try:
            batch.ran = run_batch(
                self.name, self._runtimes[0], [batch.items[0].inputs], [batch.rows]
            )
        except Exception as exc:  # run_batch answers every error; this is a bug of ours
            error = InferenceFailedError(f"{self.name}: {exc!r}")
            batch.ran = Ran([error], [(batch.rows, time.monotonic() - batch.started)])
        batch.compute_s = time.monotonic() - batch.started
        self._finished(batch)

    def _finished(self, batch: _Batch) -> None:
        """A thread ran ``batch``: the next one starts before its answers are written, which
        go out in dispatch order with ``preserve_ordering``."""
        self._busy -= 1
        ran = batch.ran
        assert ran is not None
        self._last_rows = batch.rows
        self._learn(batch.rows, batch.compute_s)
        if self._inline_max_s and len(batch.items) == 1:
            self._learn_alone(batch.items[0].key, batch.compute_s)
        if len(ran.runs) > 1:
            self._rerun_batches += 1
        if self._observer is not None:
            for run_rows, run_s in ran.runs:  # a batch run again counts every execution
                self._observer(run_rows, run_s)
        self._start_next()  # before the answers: the instance is free now
        if self.config.preserve_ordering:
            self._ran_early.add(batch)
            while self._dispatched and self._dispatched[0] in self._ran_early:
                first = self._dispatched.pop(0)
                self._ran_early.discard(first)
                self._deliver(first)
        else:
            self._dispatched.remove(batch)
            self._deliver(batch)
        if not self._dispatched:
            self._all_answered.set()
        self._update_idle()
        if self._pending:  # a hold to time, another batch to form
            self._poke()

    def _start_next(self) -> None:
        if self._closed or self._busy >= self._slots:
            return
        batch = self._form_batch(time.monotonic())
        if batch is not None:
            self._dispatch(batch)

    def _deliver(self, batch: _Batch) -> None:
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
                ItemResult(result, batch.started - item.enqueued, batch.compute_s, batch_rows)
            )

    def _learn_alone(self, key: tuple[object, ...], compute_s: float) -> None:
        known = self._alone_s.get(key)
        if known is None and len(self._alone_s) >= MAX_SHAPES_TIMED:
            self._alone_s.clear()  # dynamic shapes without end: start again
        self._alone_s[key] = compute_s if known is None else known + 0.2 * (compute_s - known)

    def _learn(self, rows: int, compute_s: float) -> None:
        self._batch_s += 0.2 * (compute_s - self._batch_s)
        self._rows_per_batch += 0.2 * (rows - self._rows_per_batch)
