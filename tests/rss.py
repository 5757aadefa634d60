"""A process's resident memory, sampled from a thread while a phase of a test runs: its value
before, its peak and every sample (for the memory bounds of the load and limit tests)."""

from __future__ import annotations

import threading

import psutil


class PeakRss:
    def __init__(self, pid: int, *, interval_s: float = 0.01, settle_s: float = 0.0) -> None:
        """``settle_s``: keep sampling this long after the phase (what a request left behind
        shows after its answer too)."""
        self.process = psutil.Process(pid)
        self.before = self.process.memory_info().rss
        self.samples = [self.before]
        self.interval_s = interval_s
        self.settle_s = settle_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def peak(self) -> int:
        return max(self.samples)

    @property
    def growth(self) -> int:
        return self.peak - self.before

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.settle_s:
            self._stop.wait(self.settle_s)
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.process.memory_info().rss)
