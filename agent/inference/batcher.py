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

Outputs are split back by rows after checking each output has the summed row count; a batch
whose outputs do not (a model whose first dimension is dynamic but not the batch) is run again
one request at a time, as a failing batch is.

A failing batch fails only its own requests, and of those only the ones at fault: some
failures depend on one request's data and show only when the model runs (an index past an
embedding table, a string that is not UTF-8), so a batch of several requests that fails that
way is run again one request at a time (:func:`_run_batch`). A request that times out in the
queue is answered with :class:`DeadlineExceededError` and never run; one whose
caller went away (its future cancelled) is dropped.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from agent.errors import DeadlineExceededError, OverloadedError, ShuttingDownError
from agent.inference.priority import lower_this_thread
from agent.model_config import BatchingConfig
from runtimes.base import Runtime, check_rows
from runtimes.errors import InferenceFailedError, InvalidInputError, RuntimeFailure

Arrays = dict[str, np.ndarray]

MAX_HOLD_S = 0.02
"""Longest an undersized batch is held for balance, whatever the model's compute time."""
HOLD_FRACTION = 0.25
"""The hold as a fraction of the average batch's compute time: the most the instance idles."""


@dataclass(frozen=True)
class ItemResult:
    outputs: Arrays
    queue_s: float
    compute_s: float
    batch_rows: int


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


# NOTE: the failures that may come from one request's data. InvalidInputError is a value the
# backend refused at run time (a string that is not UTF-8); InferenceFailedError is the backend
# failing while it ran valid-looking inputs (ONNX Runtime's Gather on an index past its table).
# Any other error is about the instance or the model (DeviceUnavailableError, a RuntimeFailure
# for a closed session, an exception no backend translated): running the requests again alone
# would fail each of them the same way, only later, so they fail at once.
_DATA_FAILURES: tuple[type[RuntimeFailure], ...] = (InvalidInputError, InferenceFailedError)


@dataclass(frozen=True)
class _Ran:
    """What an instance's thread made of one batch."""

    results: list[Arrays | RuntimeFailure]
    """Per request, in order: its outputs or its error."""
    runs: list[tuple[int, float]]
    """(rows, seconds) of every execution: one, or one more per request after a failure."""


def _run_batch(name: str, runtime: Runtime, parts: list[Arrays], rows: list[int]) -> _Ran:
    """Stack the requests' inputs, run them and split the outputs, in the instance's thread:
    the copy of a batch of images (2.4 MB for four 224x224 ones) is kept off the event loop.

    If a batch of several requests fails in a way that may come from one request's data, each
    request runs again alone, so that only the offender gets the error. That costs at most one
    run per request, once: a request that fails alone is not retried, and a failure of the
    instance during the singles fails the rest at once.
    """
    started = time.monotonic()
    if len(parts) == 1:
        result = _run_one(name, runtime, parts[0])
        return _Ran([result], [(rows[0], time.monotonic() - started)])
    stacked = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    batch = _run_one(name, runtime, stacked)
    if not isinstance(batch, RuntimeFailure):
        try:  # outputs that cannot be split by rows: each request runs alone, below
            check_rows(name, batch, sum(rows))
        except InferenceFailedError as exc:
            batch = exc
    runs = [(sum(rows), time.monotonic() - started)]
    if not isinstance(batch, RuntimeFailure):
        offsets = np.cumsum([0, *rows])
        split: list[Arrays | RuntimeFailure] = [
            {k: v[offsets[i] : offsets[i + 1]] for k, v in batch.items()} for i in range(len(parts))
        ]
        return _Ran(split, runs)
    if not isinstance(batch, _DATA_FAILURES):
        return _Ran([batch] * len(parts), runs)
    results: list[Arrays | RuntimeFailure] = []
    for part, part_rows in zip(parts, rows, strict=True):
        started = time.monotonic()
        result = _run_one(name, runtime, part)
        runs.append((part_rows, time.monotonic() - started))
        results.append(result)
        if isinstance(result, RuntimeFailure) and not isinstance(result, _DATA_FAILURES):
            results.extend([result] * (len(parts) - len(results)))  # the instance is gone
            break
    return _Ran(results, runs)


def _run_one(name: str, runtime: Runtime, inputs: Arrays) -> Arrays | RuntimeFailure:
    try:
        return runtime.infer(inputs)
    except RuntimeFailure as exc:
        return exc
    except Exception as exc:  # a backend bug must not take the server down
        error = InferenceFailedError(f"{name}: {exc!r}")
        error.__cause__ = exc
        return error


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
    ) -> None:
        """``nice_offset``: the instances' threads run that many nice steps below the event
        loop (:mod:`agent.inference.priority`)."""
        self.name = name
        self.config = config
        self.batched = batched and config.max_batch_size > 0
        self.max_rows = config.max_batch_size if self.batched else 1
        self._runtimes = list(runtimes)
        self._executors = [
            ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix=f"{name}-{i}",
                initializer=lower_this_thread,
                initargs=(nice_offset,),
            )
            for i in range(len(self._runtimes))
        ]
        self._observer = observer
        self._queues: list[list[_Item]] = [[] for _ in range(config.priority_levels)]
        self._pending = 0
        self._free = list(range(len(self._runtimes)))
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._running: set[asyncio.Task[None]] = set()
        self._scheduler: asyncio.Task[None] | None = None
        self._closed = False
        self._last_delivered: asyncio.Future[None] | None = None
        # Smoothed cost of a batch, for an honest Retry-After.
        self._batch_s = 0.01
        self._rows_per_batch = 1.0
        self._last_rows = 0
        self._hold_until: float | None = None
        self._hold_rows = 0
        self._rerun_batches = 0

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._scheduler = asyncio.create_task(self._schedule(), name=f"batcher:{self.name}")

    async def drain(self) -> None:
        """Wait until nothing is queued or running."""
        await self._idle.wait()

    async def close(self) -> None:
        """Fail whatever still waits, wait for running batches, release executors and runtimes."""
        self._closed = True
        if self._scheduler is not None:
            self._scheduler.cancel()
            await asyncio.gather(self._scheduler, return_exceptions=True)
        for queue in self._queues:
            for item in queue:
                if not item.future.done():
                    item.future.set_exception(ShuttingDownError(f"{self.name} was unloaded"))
            queue.clear()
        self._pending = 0
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        for executor, runtime in zip(self._executors, self._runtimes, strict=True):
            executor.submit(runtime.close)
            executor.shutdown(wait=False)
        self._idle.set()

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def rerun_batches(self) -> int:
        """Batches that failed and were run again one request at a time (:func:`_run_batch`)."""
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
        self._changed.set()

    def submit(
        self, inputs: Arrays, rows: int, *, priority: int, timeout_s: float | None
    ) -> asyncio.Future[ItemResult]:
        """Queue a (validated) request, splitting it if it has more rows than a batch holds.
        Cancelling the future drops what has not run yet."""
        if rows <= self.max_rows or not self.batched:
            return self._submit(inputs, rows, priority, timeout_s)
        pieces = range(0, rows, self.max_rows)
        if self._pending + len(pieces) > self.config.max_queue_size:
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
        whole: asyncio.Future[ItemResult] = asyncio.get_running_loop().create_future()

        def piece_done(_: asyncio.Future[ItemResult]) -> None:
            if whole.done():
                return
            failed = next(
                (
                    f.exception()
                    for f in futures
                    if f.done() and not f.cancelled() and f.exception()
                ),
                None,
            )
            if failed is not None:
                whole.set_exception(failed)
                for f in futures:
                    f.cancel()
                self._changed.set()
            elif all(f.done() for f in futures):
                results = [f.result() for f in futures]
                outputs = {
                    k: np.concatenate([r.outputs[k] for r in results]) for k in results[0].outputs
                }
                whole.set_result(
                    ItemResult(
                        outputs,
                        queue_s=max(r.queue_s for r in results),
                        compute_s=sum(r.compute_s for r in results),
                        batch_rows=max(r.batch_rows for r in results),
                    )
                )

        def whole_done(_: asyncio.Future[ItemResult]) -> None:
            if whole.cancelled():
                for f in futures:
                    f.cancel()  # the scheduler drops cancelled requests that have not run
                self._changed.set()

        for f in futures:
            f.add_done_callback(piece_done)
        whole.add_done_callback(whole_done)
        return whole

    def _submit(
        self, inputs: Arrays, rows: int, priority: int, timeout_s: float | None
    ) -> asyncio.Future[ItemResult]:
        if self._closed:
            raise ShuttingDownError(f"{self.name} is unloading")
        if self._pending >= self.config.max_queue_size:
            raise self._overloaded()
        now = time.monotonic()
        item = _Item(
            inputs,
            rows,
            shape_key(inputs, self.batched),
            priority,
            now + timeout_s if timeout_s else None,
            now,
            asyncio.get_running_loop().create_future(),
        )
        self._queues[priority - 1].append(item)
        self._pending += 1
        self._idle.clear()
        self._changed.set()
        return item.future

    def _overloaded(self) -> OverloadedError:
        rows_per_s = len(self._runtimes) * self._rows_per_batch / max(self._batch_s, 1e-6)
        queued_rows = sum(i.rows for q in self._queues for i in q)
        retry = max(1, math.ceil(queued_rows / max(rows_per_s, 1e-6)))
        return OverloadedError(
            f"model {self.name}: queue is full ({self.config.max_queue_size} requests waiting)",
            retry_after_s=retry,
        )

    # -- scheduling -----------------------------------------------------------------------

    async def _schedule(self) -> None:
        """One loop per model version: expire, form a batch when an instance is free, or sleep
        until something changes (a submission, a finished batch) or a deadline comes."""
        while True:
            now = time.monotonic()
            self._expire(now)
            batch = self._form_batch(now) if self._free else None
            if batch is not None:
                self._dispatch(self._free.pop(), batch)
                continue
            self._update_idle()
            wake_at = self._next_wake()
            self._changed.clear()
            if wake_at is None:
                await self._changed.wait()
            else:  # a timer that sets the event: wait_for would wrap the wait in a task
                timer = asyncio.get_running_loop().call_later(
                    max(wake_at - now, 0), self._changed.set
                )
                try:
                    await self._changed.wait()
                finally:
                    timer.cancel()

    def _dispatch(self, instance: int, batch: list[_Item]) -> None:
        """Hand the batch to its instance's thread now; a task waits for it and answers."""
        prev, delivered = self._last_delivered, None
        if self.config.preserve_ordering:
            delivered = asyncio.get_running_loop().create_future()
            self._last_delivered = delivered
        live = [i for i in batch if not i.future.done()]
        work = None
        if live:
            work = self._executors[instance].submit(
                _run_batch,
                self.name,
                self._runtimes[instance],
                [i.inputs for i in live],
                [i.rows for i in live],
            )
        task = asyncio.create_task(
            self._execute(instance, live, work, time.monotonic(), prev, delivered),
            name=f"batch:{self.name}",
        )
        self._running.add(task)
        task.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._update_idle()

    def _update_idle(self) -> None:
        if self._pending == 0 and not self._running:
            self._idle.set()

    def _form_batch(self, now: float) -> list[_Item] | None:
        """The batch to run now, or None to wait for more requests (or for none at all)."""
        head = next((q[0] for q in self._queues if q), None)
        if head is None:
            self._hold_until = None
            return None
        candidates = self._candidates(head)
        rows = sum(i.rows for i in candidates)
        take: list[_Item] | None = None
        if not self.batched or rows >= self.max_rows:
            take = candidates
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
        """When the scheduler must look again without being woken: the oldest request's
        batching delay (if an instance is free) or the earliest queue deadline."""
        times = [i.deadline for q in self._queues for i in q if i.deadline is not None]
        head = next((q[0] for q in self._queues if q), None)
        if head is not None and self._free:
            if self.config.max_queue_delay_us:
                times.append(head.enqueued + self.config.max_queue_delay_us / 1e6)
            elif self._hold_until is not None:
                times.append(self._hold_until)
        return min(times) if times else None

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
        taken = {id(i) for i in items}
        for level, queue in enumerate(self._queues):
            if any(id(i) in taken for i in queue):
                self._queues[level] = [i for i in queue if id(i) not in taken]
        self._pending -= len(items)

    def _expire(self, now: float) -> None:
        """Answer requests past their deadline and drop those whose caller went away."""
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

    async def _execute(
        self,
        instance: int,
        live: list[_Item],
        work: Future[_Ran] | None,
        started: float,
        prev: asyncio.Future[None] | None,
        delivered: asyncio.Future[None] | None,
    ) -> None:
        freed = False
        try:
            if work is None:
                return
            rows = sum(i.rows for i in live)
            try:
                ran = await asyncio.wrap_future(work)
            except Exception as exc:  # _run_batch answers every error; this is a bug of ours
                error = InferenceFailedError(f"{self.name}: {exc!r}")
                ran = _Ran([error] * len(live), [(rows, time.monotonic() - started)])
            compute_s = time.monotonic() - started
            self._last_rows = rows
            self._learn(rows, compute_s)
            if len(ran.runs) > 1:
                self._rerun_batches += 1
            if self._observer is not None:
                for run_rows, run_s in ran.runs:  # a batch run again counts every execution
                    self._observer(run_rows, run_s)
            # The next batch starts before this one's answers are written: the instance does
            # not wait for the event loop to get round to the scheduler.
            self._free.append(instance)
            freed = True
            self._start_next()
            if prev is not None:
                await asyncio.shield(prev)  # preserve_ordering: earlier batches answer first
            self._deliver(live, ran, started, compute_s, rows)
        finally:
            if not freed:
                self._free.append(instance)
            self._changed.set()
            if delivered is not None and not delivered.done():
                delivered.set_result(None)

    def _start_next(self) -> None:
        if self._closed:
            return
        batch = self._form_batch(time.monotonic())
        if batch is not None:
            self._dispatch(self._free.pop(), batch)

    def _deliver(
        self, items: list[_Item], ran: _Ran, started: float, compute_s: float, rows: int
    ) -> None:
        alone = len(ran.runs) > 1  # run again one by one: each request's batch was itself
        for item, result in zip(items, ran.results, strict=True):
            if item.future.done():  # cancelled while running: nobody to answer
                continue
            if isinstance(result, RuntimeFailure):
                item.future.set_exception(result)
                continue
            batch_rows = item.rows if alone else rows
            item.future.set_result(
                ItemResult(result, started - item.enqueued, compute_s, batch_rows)
            )

    def _learn(self, rows: int, compute_s: float) -> None:
        self._batch_s += 0.2 * (compute_s - self._batch_s)
        self._rows_per_batch += 0.2 * (rows - self._rows_per_batch)
