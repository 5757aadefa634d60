"""Fakes that implement the runtime interface around a real runtime, for tests that need to
hold a batch in flight (queue full, deadlines, priority, disconnects, swaps)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from runtimes.backends import open_model
from runtimes.base import Placement, Runtime
from runtimes.settings import RuntimeSettings
from runtimes.signature import ModelSignature


class Gate:
    """Blocks every batch until opened; records what ran, in order."""

    def __init__(self, *, closed: bool = True) -> None:
        self.held_marks: set[float] = set()
        """Batches with a row whose first value is one of these wait for :meth:`release`."""
        self._released = threading.Event()
        self._open = threading.Event()
        if not closed:
            self._open.set()
        self.entered = threading.Semaphore(0)
        self.ran: list[np.ndarray] = []
        self._lock = threading.Lock()

    def open(self) -> None:
        self._open.set()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        """Hold every later batch; forget what ran so far (the load's warm-up)."""
        self._open.clear()
        with self._lock:
            self.ran.clear()
            self.entered = threading.Semaphore(0)

    def wait_entered(self, timeout_s: float = 30) -> None:
        """Wait until a batch has reached the runtime (and is held there)."""
        if not self.entered.acquire(timeout=timeout_s):
            raise TimeoutError("no batch reached the runtime")

    def pass_through(self, inputs: Mapping[str, np.ndarray]) -> None:
        self.entered.release()
        if not self._open.wait(timeout=60):
            raise TimeoutError("gate never opened")
        first = next(iter(inputs.values()))
        if self.held_marks & {float(row.reshape(-1)[0]) for row in first}:
            if not self._released.wait(timeout=60):
                raise TimeoutError("held batch never released")
        with self._lock:
            self.ran.append(next(iter(inputs.values())).copy())

    def first_values(self) -> list[float]:
        """The first element of every row that ran, in the order the rows ran."""
        return [float(row.reshape(-1)[0]) for batch in self.ran for row in batch]


class GatedRuntime(Runtime):
    """The real backend, behind a :class:`Gate`."""

    name = "onnxruntime"
    formats = frozenset()

    def __init__(self, inner: Runtime, gate: Gate) -> None:
        super().__init__(inner.settings)
        self.inner, self.gate = inner, gate
        self._signature = inner.signature

    def _load(self, model_file: Path, placement: Placement) -> ModelSignature:
        raise AssertionError("built already loaded")

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.gate.pass_through(inputs)
        return self.inner.infer(inputs)

    def _close(self) -> None:
        self.inner.close()


def gated_factory(gate: Gate):  # type: ignore[no-untyped-def]
    def factory(model_file: Path, placement: Placement, settings: RuntimeSettings) -> Runtime:
        return GatedRuntime(open_model(model_file, placement, settings), gate)

    return factory
