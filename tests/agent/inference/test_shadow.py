"""The shadow queue on its own: copies of served answers go to a candidate without waiting,
a full queue drops and counts, and the comparison sums are what the control plane adds up.
``SlowCandidate`` is a fake candidate runtime that answers only when the test lets it."""

from __future__ import annotations

import asyncio

import numpy as np

from agent.inference.shadow import Arrays, Shadow

SERVED = {"logits": np.array([[0.1, 0.9], [0.8, 0.2]], dtype=np.float32)}
INPUTS = {"input": np.zeros((2, 4), dtype=np.float32)}


class SlowCandidate:
    """Answers each request once :attr:`gate` is set, with ``answer`` and 5 ms of compute."""

    def __init__(self, answer: Arrays) -> None:
        self.answer = answer
        self.gate = asyncio.Event()
        self.calls = 0

    async def __call__(self, inputs: Arrays, rows: int) -> tuple[Arrays, float]:
        await self.gate.wait()
        self.calls += 1
        return self.answer, 0.005


async def _settle(shadow: Shadow, candidate: SlowCandidate, calls: int) -> None:
    async with asyncio.timeout(10):
        while candidate.calls < calls:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)  # the last comparison runs after its call returns


def test_a_full_queue_drops_copies_and_counts_them_without_waiting() -> None:
    async def main() -> None:
        candidate = SlowCandidate(SERVED)
        shadow = Shadow("m", 2, candidate, sample_share=1.0, sequence=7, queue_limit=4)
        shadow.start()
        try:
            for _ in range(20):  # a burst: offer() is synchronous, the caller never waits
                shadow.offer(INPUTS, 2, SERVED, 0.002)
            candidate.gate.set()
            await _settle(shadow, candidate, 4)
            report = shadow.window()
        finally:
            await shadow.close()
        assert (report.requests, report.dropped, report.errors) == (4, 16, 0)
        assert report.version == 2 and report.sequence == 7
        assert (report.rows, report.matched, report.max_abs_diff) == (8, 8, 0.0)
        assert report.candidate_ms_sum == 4 * 5.0 and report.serving_ms_sum == 4 * 2.0
        assert shadow.window().requests == 0  # a new window

    asyncio.run(main())


def test_the_comparison_counts_top1_matches_and_differences() -> None:
    async def main() -> None:
        flipped = {"logits": np.array([[0.9, 0.1], [0.8, 0.2]], dtype=np.float32)}
        candidate = SlowCandidate(flipped)
        candidate.gate.set()
        shadow = Shadow("m", 2, candidate, sample_share=1.0)
        shadow.start()
        try:
            shadow.offer(INPUTS, 2, SERVED, 0.001)
            await _settle(shadow, candidate, 1)
            report = shadow.window()
        finally:
            await shadow.close()
        assert (report.requests, report.rows, report.matched) == (1, 2, 1)
        assert report.max_abs_diff is not None and abs(report.max_abs_diff - 0.8) < 1e-6
        assert abs(report.rel_error_sum - 0.8 / 0.9) < 1e-6

    asyncio.run(main())


def test_a_sample_share_copies_part_of_the_requests_and_failures_are_counted() -> None:
    class Failing(SlowCandidate):
        async def __call__(self, inputs: Arrays, rows: int) -> tuple[Arrays, float]:
            self.calls += 1
            raise RuntimeError("candidate broke")

    async def main() -> None:
        candidate = Failing(SERVED)
        shadow = Shadow("m", 2, candidate, sample_share=0.25, seed=1, queue_limit=1000)
        shadow.start()
        try:
            for _ in range(400):
                shadow.offer(INPUTS, 2, SERVED, 0.001)
            sampled = shadow.queued
            await _settle(shadow, candidate, sampled)
            report = shadow.window()
        finally:
            await shadow.close()
        assert 50 < sampled < 150  # about a quarter
        assert report.errors == sampled and report.requests == 0

    asyncio.run(main())
