"""A staged candidate answering copies of live requests, off the caller's path.

The inference service offers every successful request of a model's serving version to the
model's :class:`Shadow`, if it has one (:class:`ShadowTaps`). A sampled share goes into a
bounded queue without waiting: a full queue drops the copy and counts it, so the caller's
answer never waits for the candidate. One consumer task runs the copies through the candidate
at its lowest priority, compares its answers with the serving version's and discards them:
top-1 agreement per row (arg-max of the first output), largest absolute difference, relative
error, and both versions' compute time. :meth:`Shadow.window` hands the sums over and starts
a new window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from agent.inference.versions import LoadedVersion
from common.protocol.shadow import ShadowReport

log = logging.getLogger("edgefleet.agent.shadow")

Arrays = dict[str, np.ndarray]
Candidate = Callable[[Arrays, int], Awaitable[tuple[Arrays, float]]]
"""Runs one request on the candidate: its outputs and compute seconds."""
QUEUE_LIMIT = 64
"""Copies waiting for the candidate at most; past it they are dropped (and counted)."""


def batcher_candidate(lv: LoadedVersion) -> Candidate:
    """``lv``'s batcher as a candidate, at its lowest priority (served traffic goes first)."""
    lowest = lv.config.batching.priority_levels

    async def run(inputs: Arrays, rows: int) -> tuple[Arrays, float]:
        result = await lv.batcher.infer(inputs, rows, priority=lowest, timeout_s=None)
        return result.outputs, result.compute_s

    return run


Disagreed = Callable[[str, int, Arrays, Arrays], None]
"""Told of a copy whose candidate's top-1 differed: model, serving version, inputs, outputs."""


@dataclass
class _Copy:
    inputs: Arrays
    rows: int
    outputs: Arrays
    compute_s: float
    serving_version: int = 0


class Shadow:
    """The candidate ``version`` of a model, fed sampled copies of its live requests."""

    def __init__(
        self,
        model: str,
        version: int,
        candidate: Candidate,
        *,
        sample_share: float,
        sequence: int | None = None,
        queue_limit: int = QUEUE_LIMIT,
        seed: int | None = None,
    ) -> None:
        self.model = model
        self.version = version
        self.sequence = sequence
        self.sample_share = sample_share
        self._candidate = candidate
        self._queue: asyncio.Queue[_Copy] = asyncio.Queue(maxsize=queue_limit)
        self._random = random.Random(seed)
        self._report = ShadowReport(version=version, sequence=sequence)
        self._task: asyncio.Task[None] | None = None
        self.on_disagreement: Disagreed | None = None
        """Told of each copy the candidate disagreed on (data capture)."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._consume(), name=f"shadow:{self.model}")

    async def close(self) -> None:
        """Stop comparing; copies still queued are dropped."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def queued(self) -> int:
        """Copies waiting for the candidate."""
        return self._queue.qsize()

    def offer(
        self, inputs: Arrays, rows: int, outputs: Arrays, compute_s: float, serving: int = 0
    ) -> None:
        """A served request's inputs and answer (by version ``serving``): copied to the
        candidate if sampled and the queue has room. Never blocks."""
        if self.sample_share < 1 and self._random.random() >= self.sample_share:
            return
        try:
            self._queue.put_nowait(_Copy(inputs, rows, outputs, compute_s, serving))
        except asyncio.QueueFull:
            self._report.dropped += 1

    def window(self) -> ShadowReport:
        """The comparison since the last call; a new window starts."""
        done, self._report = (
            self._report,
            ShadowReport(version=self.version, sequence=self.sequence),
        )
        return done

    async def _consume(self) -> None:
        while True:
            copy = await self._queue.get()
            try:
                outputs, compute_s = await self._candidate(copy.inputs, copy.rows)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # the candidate's failure is a finding, not the serving version's problem
                self._report.errors += 1
                log.debug("shadow request failed", extra={"model": self.model, "error": str(exc)})
                continue
            self._compare(copy, outputs, compute_s)

    def _compare(self, copy: _Copy, outputs: Arrays, compute_s: float) -> None:
        r = self._report
        names = [n for n in copy.outputs if n in outputs]
        if not names:
            r.errors += 1
            return
        worst = scale = 0.0
        for name in names:
            served = np.asarray(copy.outputs[name], dtype=np.float64)
            got = np.asarray(outputs[name], dtype=np.float64)
            if served.shape != got.shape:
                r.errors += 1
                return
            if served.size:
                worst = max(worst, float(np.max(np.abs(got - served))))
                scale = max(scale, float(np.max(np.abs(served))))
        first_served = np.asarray(copy.outputs[names[0]])
        first_got = np.asarray(outputs[names[0]])
        rows = first_served.shape[0] if first_served.ndim > 1 else 1
        top_served = first_served.reshape(rows, -1).argmax(axis=1)
        top_got = first_got.reshape(rows, -1).argmax(axis=1)
        r.requests += 1
        r.rows += rows
        agreed = int(np.count_nonzero(top_served == top_got))
        r.matched += agreed
        if agreed < rows and self.on_disagreement is not None:
            self.on_disagreement(self.model, copy.serving_version, copy.inputs, copy.outputs)
        r.max_abs_diff = worst if r.max_abs_diff is None else max(r.max_abs_diff, worst)
        r.rel_error_sum += worst / scale if scale > 0 else 0.0
        r.candidate_ms_sum += compute_s * 1000
        r.serving_ms_sum += copy.compute_s * 1000


class ShadowTaps:
    """The shadows the agent runs, by model: where the inference service offers answers."""

    def __init__(self) -> None:
        self.by_model: dict[str, Shadow] = {}
        self.on_disagreement: Disagreed | None = None
        """Given to every shadow offered a copy (data capture's shadow trigger)."""

    def offer(
        self, lv: LoadedVersion, inputs: Arrays, rows: int, outputs: Arrays, compute_s: float
    ) -> None:
        shadow = self.by_model.get(lv.model)
        if shadow is not None and shadow.version != lv.version:
            shadow.on_disagreement = self.on_disagreement
            shadow.offer(inputs, rows, outputs, compute_s, lv.version)
