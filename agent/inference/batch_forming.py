"""How the batcher (:mod:`agent.inference.batcher`) forms its batches from the queues: the
head request and those that fit with it, a preferred size, a batching delay, a balanced hold;
queue deadlines and requests given up; taking back batches no thread has started.

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
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import TYPE_CHECKING

import numpy as np

from agent.errors import DeadlineExceededError
from agent.inference.batch_run import ItemResult, Ran
from common.model_config import BatchingConfig
from runtimes.base import Runtime

Arrays = dict[str, np.ndarray]

MAX_HOLD_S = 0.02
"""Longest an undersized batch is held for balance, whatever the model's compute time."""
HOLD_FRACTION = 0.25
"""The hold as a fraction of the average batch's compute time: the most the instance idles."""


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


class BatchForming:
    """The scheduling half of :class:`agent.inference.batcher.Batcher`: what it reads and
    writes is the batcher's own state, set up in its ``__init__``; it runs a batch there
    (``_run_inline``, the execution half)."""

    name: str
    config: BatchingConfig
    batched: bool
    max_rows: int
    _runtimes: list[Runtime]
    _claim: threading.Lock
    _queues: list[list[_Item]]
    _pending: int
    _dispatched: list[_Batch]
    _busy: int
    _timed: int
    _gone: bool
    _idle: asyncio.Event
    _all_answered: asyncio.Event
    _batch_s: float
    _last_rows: int
    _hold_until: float | None
    _hold_rows: int
    _loop: asyncio.AbstractEventLoop | None
    _work: SimpleQueue[_Batch | None]
    _slots: int
    _poked: bool
    _wake: asyncio.TimerHandle | None
    _wake_at: float
    _closed: bool
    _inline_max_s: float
    _alone_s: dict[tuple[object, ...], float]

    if TYPE_CHECKING:

        def _run_inline(self, batch: _Batch) -> None: ...

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
