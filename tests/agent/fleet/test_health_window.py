"""The health window on its own: real version statistics, criteria from the wire, and a clock
the test sets; no agent, no broker, no sleeps."""

from __future__ import annotations

import asyncio
import time

from agent.fleet.health import HealthWindow
from agent.inference.stats import VersionStats
from common.protocol.messages import HealthCriteria


def stats(successes: int = 0, latency_s: float = 0.01, **failures: int) -> VersionStats:
    s = VersionStats()
    for _ in range(successes):
        s.record_success(latency_s, 0.0, latency_s)
    for reason, n in failures.items():
        for _ in range(n):
            s.record_failure(latency_s, reason)
    return s


def window(
    s: VersionStats, baseline_p99_s: float | None = None, **criteria: object
) -> HealthWindow:
    return HealthWindow(
        HealthCriteria.model_validate(criteria),
        s,
        opened_at=time.monotonic() - 1.0,  # before every request the test records
        baseline_p99_s=baseline_p99_s,
    )


def test_the_error_budget_is_spent_only_past_the_rate_allowed() -> None:
    criteria = {"min_requests": 4, "max_error_rate": 0.25}
    assert window(stats(3, inference_failed=1), **criteria).error_verdict() is None
    verdict = window(stats(3, inference_failed=2), **criteria).error_verdict()
    assert verdict == "error rate 40.0% over 5 requests exceeds 25.0%"


def test_errors_are_not_judged_below_the_minimum_of_requests() -> None:
    assert window(stats(1, inference_failed=2), min_requests=4).error_verdict() is None


def test_a_client_s_bad_request_is_not_the_model_s_error() -> None:
    w = window(stats(1, invalid_input=9), min_requests=1, max_error_rate=0.0)
    assert w.requests == 10
    assert w.error_verdict() is None


def test_a_p99_past_the_ratio_of_the_previous_version_s_fails_at_the_end() -> None:
    slow = window(stats(5, latency_s=0.05), 0.01, min_requests=5, max_p99_ratio=1.5)
    assert slow.latency_verdict() == (
        "p99 latency 50.0 ms is 5.00x the previous version's 10.0 ms (limit 1.5x)"
    )
    fine = window(stats(5, latency_s=0.012), 0.01, min_requests=5, max_p99_ratio=1.5)
    assert fine.latency_verdict() is None


def test_without_a_baseline_or_enough_requests_latency_is_not_judged() -> None:
    assert window(stats(5, latency_s=9.0), None, min_requests=5).latency_verdict() is None
    assert window(stats(4, latency_s=9.0), 0.01, min_requests=5).latency_verdict() is None


def test_the_baseline_is_the_previous_version_s_p99_once_it_had_enough_requests() -> None:
    criteria = HealthCriteria(min_requests=3)
    now = time.monotonic()
    busy = HealthWindow.opening(criteria, stats(), [stats(3, latency_s=0.02)], now)
    assert busy.baseline_p99_s == 0.02
    quiet = HealthWindow.opening(criteria, stats(), [stats(2, latency_s=0.02)], now)
    assert quiet.baseline_p99_s is None
    assert busy.closes_at == now + criteria.window_s


def test_watching_a_window_that_is_over_gives_the_latency_verdict() -> None:
    w = window(stats(5, latency_s=0.05), 0.01, min_requests=5, window_s=30)
    verdict = asyncio.run(w.watch(clock=lambda: w.closes_at))
    assert verdict is not None and verdict.startswith("p99 latency 50.0 ms")


def test_a_window_that_passes_gives_no_verdict() -> None:
    w = window(stats(5), 0.01, min_requests=5, window_s=30)
    assert asyncio.run(w.watch(clock=lambda: w.closes_at + 1)) is None


def test_a_failure_during_the_window_wakes_it_and_ends_it_early() -> None:
    s = stats(2)
    w = window(s, min_requests=4, max_error_rate=0.1, window_s=3600)

    async def scenario() -> str | None:
        loop = asyncio.get_running_loop()
        for _ in range(2):  # during the window: 2 errors of 4 requests
            loop.call_soon(s.record_failure, 0.01, "inference_failed")
        # the clock never reaches the window's end: only the failures can end it
        return await asyncio.wait_for(w.watch(clock=lambda: w.opened_at), timeout=10)

    assert asyncio.run(scenario()) == "error rate 50.0% over 4 requests exceeds 10.0%"
