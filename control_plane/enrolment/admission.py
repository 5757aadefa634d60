"""Admission of enrolment requests: a token bucket and a bound on those in flight, so that a
fleet powered on at once (or a flood of bogus claims) is spread over time instead of queueing
without bound in the control plane, its database pool and the broker.

A refused request is told when to come back (``Retry-After``), a later slot for each, as a
virtual queue gives out: the n-th device refused in a burst is told about n / rate seconds, so
the refused come back spread at the admitted rate, not all at once (the agent adds its own
jitter on top, :func:`agent.fleet.enrol.jittered_retry_after`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

SERVICE_WEIGHT = 0.05
"""The weight of the latest request in :attr:`Admission.service_s`."""


class Admission:
    def __init__(
        self,
        *,
        rate_per_s: float,
        burst_requests: int,
        max_in_flight_requests: int,
        max_retry_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst_requests)
        self.max_in_flight = max_in_flight_requests
        self.max_retry_after_s = max_retry_after_s
        self.clock = clock
        self.tokens = self.burst
        self.in_flight = 0
        self.refused = 0
        self._at = clock()
        self._last_slot = self._at
        """The latest time a refused request was told to come back at."""
        self.service_s = 0.0
        """A moving average of how long an admitted request took to answer."""

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self._at) * self.rate_per_s)
        self._at = now

    def try_enter(self) -> int | None:
        """Admit one request (None; call :meth:`leave` when it is answered), or refuse it:
        the whole seconds after which to ask again (at least 1)."""
        self._refill()
        if self.tokens >= 1 and self.in_flight < self.max_in_flight:
            self.tokens -= 1
            self.in_flight += 1
            return None
        self.refused += 1
        now = self._at
        # the slots are as far apart as requests are admitted: by the rate, or by how fast
        # those in flight are answered when that is slower
        interval = max(1.0 / self.rate_per_s, self.service_s / self.max_in_flight)
        slot = max(self._last_slot, now) + interval
        if slot - now <= self.max_retry_after_s:  # past the cap, all are told the cap
            self._last_slot = slot
        return math.ceil(min(self.max_retry_after_s, max(1.0, slot - now)))

    def leave(self, took_s: float) -> None:
        """An admitted request was answered, after ``took_s``."""
        self.in_flight -= 1
        self.service_s += SERVICE_WEIGHT * (took_s - self.service_s)
