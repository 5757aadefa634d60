"""The batch former a batcher (:mod:`agent.inference.batcher`) owns: its queues by priority,
the batches handed out and not answered, holds and deadlines. It decides which requests run
together and when (the head request and those that fit with it, a preferred size, a batching
delay, a balanced hold), answers requests past their queue deadline, drops those given up, and
takes back batches no thread has started. It runs nothing and starts no timer: every decision
takes ``now`` (``time.monotonic()``) as a parameter, and :meth:`BatchFormer.next_wake` says when
the batcher must ask again.

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
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from agent.errors import DeadlineExceededError
from agent.inference.batch_run import ItemResult, Ran
from common.model_config import BatchingConfig

Arrays = dict[str, np.ndarray]

MAX_HOLD_S = 0.02
"""Longest an undersized batch is held for balance, whatever the model's compute time."""
HOLD_FRACTION = 0.25
"""The hold as a fraction of the average batch's compute time: the most the instance idles."""


@dataclass(eq=False)
class Item:
    """A request waiting for a batch: its decoded inputs, the rows they hold, the shapes that
    must match to share a batch (:func:`shape_key`), and the future its answer goes to."""

    inputs: Arrays
    rows: int
    key: tuple[object, ...]
    priority: int
    deadline: float | None
    enqueued: float
    future: asyncio.Future[ItemResult] = field(repr=False)


QUEUED, STARTED, WITHDRAWN = 0, 1, 2
"""A handed-out batch's states: no thread has claimed it, one has, the former took it back."""


@dataclass(eq=False)
class Batch:
    """A batch handed to the instances' threads. A thread claims a queued one
    (:meth:`BatchFormer.claim`) and sets ``started``, ``ran`` and ``compute_s`` before handing
    it back to the event loop; the former may withdraw one no thread has claimed."""

    items: list[Item]
    rows: int
    state: int = QUEUED
    started: float = 0.0
    ran: Ran | None = None
    compute_s: float = 0.0


def shape_key(inputs: Arrays, batched: bool) -> tuple[object, ...]:
    """Requests share a batch only if every input's non-batch shape and dtype agree."""
    skip = 1 if batched else 0
    return tuple((name, a.shape[skip:], a.dtype.str) for name, a in sorted(inputs.items()))


class BatchFormer:
    """The queues and the batches out of one batcher, and the decisions over them.

    The event loop calls every method but :meth:`claim`, which an instance's thread calls
    before it runs a batch (the one lock here is between the two).
    """

    def __init__(
        self, name: str, config: BatchingConfig, *, batched: bool, instances: int, slots: int
    ) -> None:
        """``instances``: batches that can run at once; ``slots``: batches handed out at once
        (the instances and the full batches queued for the first one that frees)."""
        self.name = name
        self.config = config
        self.batched = batched and config.max_batch_size > 0
        self.max_rows = config.max_batch_size if self.batched else 1
        self.instances = instances
        self.slots = slots
        self._claim = threading.Lock()
        self._queues: list[list[Item]] = [[] for _ in range(config.priority_levels)]
        self._queued = 0
        self._out: list[Batch] = []
        """Batches handed out and not answered yet, in the order they were."""
        self._ran_early: set[Batch] = set()
        """With ``preserve_ordering``: batches run, waiting for an earlier one to be answered."""
        self._busy = 0
        """Batches handed out and not run yet."""
        self._timed = 0
        """Requests with a queue deadline and no answer yet: while there are none, a pass looks
        for neither expired requests nor the next deadline."""
        self._gone = False
        """A request was given up since the last expiry: the next one drops what was."""
        # Smoothed cost of a batch: the hold's length, and an honest Retry-After.
        self._batch_s = 0.01
        self._rows_per_batch = 1.0
        self._last_rows = 0
        self._hold_until: float | None = None
        self._hold_rows = 0

    # -- what it holds --------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Requests in the queues (not counting those in a batch handed out)."""
        return self._queued

    @property
    def pending(self) -> int:
        """Requests waiting: queued, or in a batch no thread has started."""
        return self._queued + sum(len(b.items) for b in self._out if b.state == QUEUED)

    @property
    def running(self) -> int:
        """Batches started and not answered yet."""
        return sum(1 for b in self._out if b.state == STARTED)

    @property
    def busy(self) -> int:
        """Batches handed out and not run yet."""
        return self._busy

    @property
    def has_room(self) -> bool:
        """Whether another batch may be handed out."""
        return self._busy < self.slots

    @property
    def all_answered(self) -> bool:
        """No batch handed out waits for its answers."""
        return not self._out

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing handed out."""
        return self._queued == 0 and not self._out

    # -- requests -------------------------------------------------------------------------

    def enqueue(self, item: Item) -> None:
        """Queue ``item`` behind those of its priority. A batch no thread has started that holds
        a request of a lower priority is taken back: this one goes first."""
        if item.deadline is not None:
            self._timed += 1
            item.future.add_done_callback(self._untimed)
        self._queues[item.priority - 1].append(item)
        self._queued += 1
        if len(self._queues) > 1 and any(
            b.state == QUEUED and any(i.priority > item.priority for i in b.items)
            for b in self._out
        ):
            self.withdraw()

    def _untimed(self, _: asyncio.Future[ItemResult]) -> None:
        self._timed -= 1

    def given_up(self) -> None:
        """A request's future was cancelled: the next :meth:`expire` drops it."""
        self._gone = True

    def retry_after_s(self) -> int:
        """Whole seconds until the queued rows could have run, at the smoothed batch cost."""
        rows_per_s = self.instances * self._rows_per_batch / max(self._batch_s, 1e-6)
        queued_rows = sum(i.rows for q in self._queues for i in q)
        return max(1, math.ceil(queued_rows / max(rows_per_s, 1e-6)))

    def fail_queued(self, error: Callable[[], BaseException]) -> None:
        """Take back the batches no thread has started and answer every request waiting with
        ``error()`` (the batcher closes)."""
        self.withdraw()
        for queue in self._queues:
            for item in queue:
                if not item.future.done():
                    item.future.set_exception(error())
            queue.clear()
        self._queued = 0

    # -- forming --------------------------------------------------------------------------

    def form(self, now: float) -> list[Item] | None:
        """The batch to run now, taken out of the queues, or None to wait for more requests
        (or for none at all)."""
        head = self._head()
        if head is None:
            self._hold_until = None
            return None
        candidates = self._candidates(head)
        rows = sum(i.rows for i in candidates)
        take: list[Item] | None = None
        if not self.batched or rows >= self.max_rows:
            take = candidates
        elif self._busy >= self.instances:  # queued behind the running ones: full only
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

    def next_wake(self) -> float | None:
        """When the former must be asked again without a request or an answer to prompt it:
        the oldest request's batching delay or hold (if an instance is free) or the earliest
        queue deadline."""
        if not self._timed and (
            self._hold_until is None
            and not self.config.max_queue_delay_us
            or self._busy >= self.instances
        ):
            return None
        times: list[float] = []
        if self._timed:
            times += [i.deadline for q in self._queues for i in q if i.deadline is not None]
            times += [
                i.deadline
                for b in self._out
                if b.state == QUEUED
                for i in b.items
                if i.deadline is not None
            ]
        head = self._head()
        if head is not None and self._busy < self.instances:
            if self.config.max_queue_delay_us:
                times.append(head.enqueued + self.config.max_queue_delay_us / 1e6)
            elif self._hold_until is not None:
                times.append(self._hold_until)
        return min(times) if times else None

    def _aim(self, rows: int, now: float) -> tuple[int, float]:
        """The batch size ``balance_batches`` aims at: half of the ``rows`` queued and those
        of the batch that just finished, both as first seen with an instance free; the hold's
        deadline is fixed then too."""
        if self._hold_until is None:
            self._hold_rows = max(1, (rows + self._last_rows + 1) // 2)
            self._hold_until = now + min(HOLD_FRACTION * self._batch_s, MAX_HOLD_S)
        return self._hold_rows, self._hold_until

    @staticmethod
    def _prefix(candidates: list[Item], rows: int) -> list[Item]:
        """The leading candidates holding at most ``rows`` rows (the first one at least)."""
        total = 0
        for n, item in enumerate(candidates):
            total += item.rows
            if total > rows:
                return candidates[: max(n, 1)]
        return candidates

    def _head(self) -> Item | None:
        """The oldest request of the highest priority."""
        for queue in self._queues:
            if queue:
                return queue[0]
        return None

    def _candidates(self, head: Item) -> list[Item]:
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

    def _preferred_prefix(self, candidates: list[Item]) -> list[Item] | None:
        preferred = set(self.config.preferred_batch_sizes)
        if not preferred:
            return None
        best, rows = None, 0
        for n, item in enumerate(candidates, 1):
            rows += item.rows
            if rows in preferred:
                best = candidates[:n]
        return best

    def _remove(self, items: list[Item]) -> None:
        queue = self._queues[items[0].priority - 1]
        n = len(items)
        if queue[:n] == items:  # the oldest of one level (Item compares by identity)
            del queue[:n]
            self._queued -= n
            return
        taken = {id(i) for i in items}
        for level, queue in enumerate(self._queues):
            if any(id(i) in taken for i in queue):
                self._queues[level] = [i for i in queue if id(i) not in taken]
        self._queued -= len(items)

    def expire(self, now: float) -> None:
        """Answer requests past their deadline and drop those whose caller went away; a batch
        no thread has started that holds one is taken back first. Nothing to do (and nothing
        looked at) while no request has a deadline and none was given up."""
        if not (self._timed or self._gone):
            return
        self._gone = False
        if any(
            b.state == QUEUED
            and any(
                i.future.done() or (i.deadline is not None and now >= i.deadline) for i in b.items
            )
            for b in self._out
        ):
            self.withdraw()
        for level, queue in enumerate(self._queues):
            keep = []
            for item in queue:
                if item.future.cancelled():
                    continue
                if item.deadline is not None and now >= item.deadline:
                    item.future.set_exception(self._past_deadline(item, now))
                    continue
                keep.append(item)
            if len(keep) != len(queue):
                self._queued -= len(queue) - len(keep)
                self._queues[level] = keep

    def _past_deadline(self, item: Item, now: float) -> DeadlineExceededError:
        assert item.deadline is not None
        waited_ms = 1000 * (now - item.enqueued)
        return DeadlineExceededError(
            f"model {self.name}: request waited {waited_ms:.1f} ms in the queue, "
            f"past its timeout of {1000 * (item.deadline - item.enqueued):.1f} ms; "
            "it was not run"
        )

    # -- batches out ----------------------------------------------------------------------

    def batch_of(self, items: list[Item]) -> Batch | None:
        """The batch of the requests :meth:`form` took that still wait for an answer, or None
        if none does (a lone request is always its own batch, if it still waits)."""
        if len(items) == 1:
            return None if items[0].future.done() else Batch(items, items[0].rows)
        live = [i for i in items if not i.future.done()]
        return Batch(live, sum(i.rows for i in live)) if live else None

    def hand_out(self, batch: Batch) -> None:
        """``batch`` goes to the instances (or runs on the event loop): it is out until
        :meth:`answered`."""
        self._out.append(batch)
        self._busy += 1

    def claim(self, batch: Batch) -> bool:
        """An instance's thread takes ``batch`` to run: False if it was taken back first."""
        with self._claim:
            if batch.state == WITHDRAWN:
                return False
            batch.state = STARTED
            return True

    def withdraw(self) -> bool:
        """Take back the batches no thread has started: their requests wait in the queues
        again, in their order (a request of a higher priority came, one of theirs timed out or
        was given up, or the batcher closes). Whether any was."""
        back: list[Batch] = []
        with self._claim:
            for batch in self._out:
                if batch.state == QUEUED:
                    batch.state = WITHDRAWN
                    back.append(batch)
        if not back:
            return False
        for batch in back:
            self._out.remove(batch)
            self._busy -= 1
            for item in batch.items:
                self._queues[item.priority - 1].append(item)
                self._queued += 1
        for level, queue in enumerate(self._queues):
            self._queues[level] = sorted(queue, key=lambda i: i.enqueued)
        return True

    def ran(self, batch: Batch) -> None:
        """An instance ran ``batch`` (it is free again): learn what the batch cost."""
        self._busy -= 1
        self._last_rows = batch.rows
        self._batch_s += 0.2 * (batch.compute_s - self._batch_s)
        self._rows_per_batch += 0.2 * (batch.rows - self._rows_per_batch)

    def answered(self, batch: Batch) -> list[Batch]:
        """The batches whose answers go out now that ``batch`` ran: ``batch`` itself, or with
        ``preserve_ordering`` those at the front of the order handed out that have all run."""
        if not self.config.preserve_ordering:
            self._out.remove(batch)
            return [batch]
        self._ran_early.add(batch)
        ready: list[Batch] = []
        while self._out and self._out[0] in self._ran_early:
            first = self._out.pop(0)
            self._ran_early.discard(first)
            ready.append(first)
        return ready
