"""The health window of an update (:class:`HealthWindow`): from the switch to the verdict, the
new version's requests are judged against the manifest's :class:`HealthCriteria` and the
previous version's latency. The window fails early once its error budget is spent; at its end
the p99 latency is compared, then the golden sample runs again (:func:`self_test_verdict`).

The window reads the clock it is given, so its verdicts are decided by numbers a test sets;
only :meth:`HealthWindow.watch` waits, woken by a failure or by the window's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from agent.errors import AgentError
from agent.inference.stats import VersionStats
from agent.inference.versions import LoadedVersion
from common.protocol.messages import HealthCriteria
from runtimes.errors import RuntimeFailure
from runtimes.golden import GOLDEN_FILE, GoldenSample

BASELINE_S = 300.0
"""How far back the previous version's latency is read for the p99 comparison."""


class HealthWindow:
    """One update's window over the new version's statistics."""

    def __init__(
        self,
        criteria: HealthCriteria,
        stats: VersionStats,
        *,
        opened_at: float,
        baseline_p99_s: float | None,
    ) -> None:
        """``opened_at``: the switch (monotonic seconds); ``baseline_p99_s``: the previous
        version's p99 latency before it, None when it had too few requests to judge by."""
        self.criteria = criteria
        self.stats = stats
        self.opened_at = opened_at
        self.baseline_p99_s = baseline_p99_s

    @classmethod
    def opening(
        cls,
        criteria: HealthCriteria,
        stats: VersionStats,
        previous: Iterable[VersionStats],
        now: float,
    ) -> HealthWindow:
        """A window opening at ``now``, its baseline read from the versions that served before
        (the last one with enough requests counts)."""
        baseline: float | None = None
        for before in previous:
            if len(before.recent) >= max(criteria.min_requests, 1):
                p99 = before.latency_percentiles(now - BASELINE_S, (99,))
                baseline = p99[0] if p99 else None
        return cls(criteria, stats, opened_at=now, baseline_p99_s=baseline)

    @property
    def closes_at(self) -> float:
        return self.opened_at + self.criteria.window_s

    @property
    def requests(self) -> int:
        """Requests the new version answered or failed so far."""
        return self.stats.success.count + self.stats.fail.count

    def error_verdict(self) -> str | None:
        """Why the window has failed already (its error budget is spent), else None."""
        requests, errors = self.requests, self.stats.model_errors()
        if (
            requests >= self.criteria.min_requests
            and requests
            and errors / requests > self.criteria.max_error_rate
        ):
            return (
                f"error rate {errors / requests:.1%} over {requests} requests exceeds "
                f"{self.criteria.max_error_rate:.1%}"
            )
        return None

    def latency_verdict(self) -> str | None:
        """At the window's end: why its p99 latency fails the comparison, else None."""
        if not self.baseline_p99_s or self.requests < self.criteria.min_requests:
            return None
        new_p99 = (self.stats.latency_percentiles(self.opened_at, (99,)) or [0.0])[0]
        ratio = new_p99 / self.baseline_p99_s
        if ratio <= self.criteria.max_p99_ratio:
            return None
        return (
            f"p99 latency {new_p99 * 1000:.1f} ms is {ratio:.2f}x the previous version's "
            f"{self.baseline_p99_s * 1000:.1f} ms (limit {self.criteria.max_p99_ratio}x)"
        )

    async def watch(self, clock: Callable[[], float] = time.monotonic) -> str | None:
        """Wait for the window's end, or for its error budget to be spent; the verdict from
        the requests (None: they pass)."""
        while True:
            verdict = self.error_verdict()
            if verdict is not None:
                return verdict
            remaining = self.closes_at - clock()
            if remaining <= 0:
                break
            self.stats.failed.clear()
            # woken by a failure to re-check the error budget, else at the window's end
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self.stats.failed.wait()
        return self.latency_verdict()


async def self_test_verdict(
    criteria: HealthCriteria, staged: LoadedVersion, version_dir: Path
) -> str | None:
    """After the window: why the version's golden sample fails through its batcher, else None
    (also when the criteria skip it or there is none)."""
    golden_path = version_dir / GOLDEN_FILE
    if not criteria.self_test or not golden_path.is_file():
        return None
    golden = GoldenSample.load(golden_path)
    rows = staged.signature.validate_inputs(golden.inputs) or 1
    try:
        result = await staged.batcher.infer(golden.inputs, rows, priority=1, timeout_s=None)
    except (AgentError, RuntimeFailure) as exc:
        return f"self-test after the window failed: {exc}"
    problems = golden.mismatches(result.outputs)
    if problems:
        return "self-test after the window failed: " + "; ".join(problems)
    return None
