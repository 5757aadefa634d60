"""Group commit for broker accounts: devices enrolling at once share one write of the password
file and one broker reload, or one message of dynamic security commands.

Each change costs the broker the whole of its user list: Mosquitto rereads the password file and
ACL on a reload, and its dynamic security plugin (2.0.x) rewrites its whole JSON file after
every command. Done one device at a time that is O(N) per device and O(N^2) for a fleet joining
at once (measured in benchmarks/fleet/enrolment.py: 5,000 devices one at a time did not finish
in minutes). Batched, the broker pays per batch, and batches grow by themselves while one is
being applied, as a database's group commit does.

No task runs in the background: the caller that takes the lock applies what every caller queued
by then, and the others find their answer waiting when they get the lock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

R = TypeVar("R")
T = TypeVar("T")

ApplyBatch = Callable[[list[str]], Awaitable[dict[str, R | Exception]]]
"""Apply a batch of device ids; each one's result, or the exception it failed with."""


class GroupCommit(Generic[R]):
    def __init__(
        self, apply: ApplyBatch[R], *, max_batch: int, min_interval_s: float = 0.0
    ) -> None:
        self._apply = apply
        self.max_batch = max_batch
        self.min_interval_s = min_interval_s
        """A batch starts no sooner than this after the one before: what queues meanwhile
        joins it (the broker reloads at most once per interval)."""
        self._last = -float("inf")
        self._lock = asyncio.Lock()
        self._queued: dict[str, list[asyncio.Future[R]]] = {}
        self.batches = 0
        """How many batches were applied (for tests and benchmarks)."""

    async def submit(self, device_id: str) -> R:
        """Queue ``device_id``; return its result once a batch holding it is applied.

        Raises:
            Exception: what applying it raised (for it alone, or for its whole batch).
        """
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queued.setdefault(device_id, []).append(fut)
        try:
            async with self._lock:
                if not fut.done():
                    await self._flush()
        except BaseException:
            fut.cancel()  # no one will read it: a batch still holding it skips it
            raise
        return fut.result()

    async def _flush(self) -> None:
        wait = self._last + self.min_interval_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self._last = time.monotonic()
        ids = list(self._queued)[: self.max_batch]
        waiters = {i: self._queued.pop(i) for i in ids}
        self.batches += 1
        try:
            results = await self._apply(ids)
        except Exception as exc:  # the whole batch failed: each of its callers hears why
            results = dict.fromkeys(ids, exc)
        except BaseException:  # cancelled: give the others their turn, uncounted
            for i, futs in waiters.items():
                self._queued.setdefault(i, []).extend(f for f in futs if not f.done())
            raise
        for i, futs in waiters.items():
            result = results.get(i, KeyError(f"the batch gave no answer for {i!r}"))
            for f in futs:
                if f.done():
                    continue
                if isinstance(result, Exception):
                    f.set_exception(result)
                else:
                    f.set_result(result)


class Batches(Generic[T, R]):
    """As :class:`GroupCommit`, for items of any kind, each with a result of its own (two
    items alike are two results): the caller that takes the lock applies every item queued by
    then, in the order they came.

    An item whose caller was cancelled after its batch began is still applied."""

    def __init__(
        self, apply: Callable[[list[T]], Awaitable[list[R | Exception]]], *, max_batch: int
    ) -> None:
        self._apply = apply
        self.max_batch = max_batch
        self._lock = asyncio.Lock()
        self._queued: list[tuple[T, asyncio.Future[R]]] = []
        self.batches = 0

    async def submit(self, item: T) -> R:
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queued.append((item, fut))
        try:
            async with self._lock:
                if not fut.done():
                    await self._flush()
        except BaseException:
            fut.cancel()
            raise
        return fut.result()

    async def _flush(self) -> None:
        taken = self._queued[: self.max_batch]
        del self._queued[: self.max_batch]
        live = [(item, fut) for item, fut in taken if not fut.done()]
        self.batches += 1
        try:
            results = await self._apply([item for item, _ in live])
        except Exception as exc:
            results = [exc] * len(live)
        except BaseException:
            self._queued[:0] = [(i, f) for i, f in live if not f.done()]
            raise
        for (_, fut), result in zip(live, results, strict=True):
            if fut.done():
                continue
            if isinstance(result, Exception):
                fut.set_exception(result)
            else:
                fut.set_result(result)
