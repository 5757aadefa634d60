"""Sampled data capture for retraining (docs/model-quality.md, "Data capture").

For a model whose config enables ``[capture]``, answered requests are captured when the
policy's sample draws them (``sample_rate``), when rows of the first ``[N, classes]`` output
score a top-1 probability under ``low_confidence_below`` (only those rows are kept), or when
the staged shadow candidate disagreed with the served answer (``shadow_disagreement``).

Nothing of it blocks a request: the event loop decides (a draw, one arg-max over the output,
the per-minute cap) and puts references to the arrays in a bounded queue (they are not written
to once answered); one thread encodes each sample as an ``.npz`` archive, checks its size and
stores it in the :class:`~agent.inference.capture_spool.CaptureSpool`. Whatever is not kept is
counted by reason (:class:`CaptureDrop`), in ``edgefleet_capture_dropped_total`` and in the
device's status. Counts are since the agent started; the spool itself survives restarts.
"""

from __future__ import annotations

import io
import logging
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.inference.capture_spool import CaptureSpool, Sample
from common.model_config import CaptureConfig
from common.protocol.capture import CaptureTrigger

if TYPE_CHECKING:
    from agent.metrics import AgentMetrics

log = logging.getLogger("edgefleet.agent.capture")
Arrays = Mapping[str, np.ndarray]
_STOP = object()
MINUTE_S = 60.0


class CaptureDrop(StrEnum):
    """Why a sample the policy chose was not kept (or not kept until uploaded)."""

    QUEUE_FULL = "queue_full"
    """The writer's queue was full: the device captures faster than it can store."""
    RATE_LIMITED = "rate_limited"
    """Past ``max_samples_per_minute``."""
    TOO_LARGE = "too_large"
    """Its archive was larger than ``max_sample_bytes``."""
    EVICTED = "evicted"
    """Deleted, oldest first, to keep the model's spool under ``max_disk_bytes``."""
    EXPIRED = "expired"
    """Not uploaded within ``retention_days``."""
    UNSTORABLE = "unstorable"
    """The storage refused it (a full disk, an I/O error)."""


def top1_probability(output: np.ndarray) -> np.ndarray | None:
    """Each row's top-1 probability of a ``[N, classes]`` output (softmaxed unless its rows
    already are probabilities); None for another shape or a non-float output."""
    if output.ndim != 2 or output.shape[1] < 2 or output.dtype.kind != "f":
        return None
    top: np.ndarray = output.max(axis=1)
    if output.min() >= 0 and top.max() <= 1 and np.abs(output.sum(axis=1) - 1).max() < 1e-3:
        return top  # probabilities already
    # the softmax's largest value: 1 / sum(exp(s - max)), without dividing every score
    top1: np.ndarray = 1.0 / np.exp(output - top[:, None]).sum(axis=1)
    return top1


def encode(inputs: Arrays, outputs: Arrays, rows: np.ndarray | None, batch: int = 0) -> bytes:
    """The sample's ``.npz`` archive (compressed, no pickles); ``rows``: the rows kept of
    every tensor whose first dimension is ``batch`` (all rows when None)."""
    arrays: dict[str, np.ndarray] = {}
    for prefix, tensors in (("input", inputs), ("output", outputs)):
        for name, array in tensors.items():
            if array.dtype == object:  # BYTES: fixed-width bytes, so no pickle is needed
                items = [x if isinstance(x, bytes) else str(x).encode() for x in array.ravel()]
                array = np.array(items, dtype=bytes).reshape(array.shape)
            if rows is not None and array.ndim and array.shape[0] == batch:
                array = array[rows]
            arrays[f"{prefix}:{name}"] = np.ascontiguousarray(array)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


@dataclass
class ModelCounts:
    """One model's capture since the agent started."""

    captured: dict[str, int] = field(default_factory=dict)
    """Samples stored, by trigger."""
    uploaded: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    """By :class:`CaptureDrop` reason."""

    def total(self) -> int:
        return sum(self.captured.values()) + self.uploaded + sum(self.dropped.values())


@dataclass
class _Pending:
    model: str
    version: int
    config: CaptureConfig
    trigger: CaptureTrigger
    inputs: Arrays
    outputs: Arrays
    rows: np.ndarray | None
    at: float
    batch: int = 0
    """The first dimension of the output the rows were chosen from."""


class CaptureTap:
    """The queue and the writer thread; :meth:`offer` is called on the event loop."""

    def __init__(
        self,
        spool: CaptureSpool,
        metrics: AgentMetrics | None = None,
        *,
        queue_samples: int = 256,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spool = spool
        self._metrics = metrics
        self._queue: queue.Queue[Any] = queue.Queue(queue_samples)
        self._random = random.Random(seed)
        self._clock = clock
        self._minutes: dict[str, tuple[float, int]] = {}
        """Per model: when its current minute began (monotonic) and the samples in it."""
        self._lock = threading.Lock()
        self.counts: dict[str, ModelCounts] = {}
        self.on_stored: Callable[[], None] | None = None
        """Called (from the writer thread) after a sample was stored: the uploader wakes."""
        self._thread = threading.Thread(target=self._run, name="capture", daemon=True)
        self._thread.start()

    # -- the event loop's side ------------------------------------------------------------

    def offer(
        self, model: str, version: int, config: CaptureConfig, inputs: Arrays, outputs: Arrays
    ) -> None:
        """An answered request: queued for capture if the policy picks it. Never blocks."""
        if not config.enabled:
            return
        trigger, rows, batch = None, None, 0
        if config.low_confidence_below is not None:
            for output in outputs.values():  # the first [N, classes] output is judged
                top = top1_probability(output)
                if top is None:
                    continue
                low = np.flatnonzero(top < config.low_confidence_below)
                if low.size:
                    trigger, rows, batch = CaptureTrigger.LOW_CONFIDENCE, low, output.shape[0]
                break
        if trigger is None and config.sample_rate and self._random.random() < config.sample_rate:
            trigger = CaptureTrigger.SAMPLED
        if trigger is not None:
            self._queue_sample(
                _Pending(model, version, config, trigger, inputs, outputs, rows, 0, batch)
            )

    def offer_disagreement(
        self, model: str, version: int, config: CaptureConfig, inputs: Arrays, outputs: Arrays
    ) -> None:
        """A request whose shadow candidate disagreed with the served answer ``outputs``."""
        if config.enabled and config.shadow_disagreement:
            trigger = CaptureTrigger.SHADOW_DISAGREEMENT
            self._queue_sample(_Pending(model, version, config, trigger, inputs, outputs, None, 0))

    def _queue_sample(self, item: _Pending) -> None:
        now = self._clock()
        began, n = self._minutes.get(item.model, (now, 0))
        if now - began >= MINUTE_S:
            began, n = now, 0
        if n >= item.config.max_samples_per_minute:
            self._drop(item.model, CaptureDrop.RATE_LIMITED)
            return
        self._minutes[item.model] = (began, n + 1)
        item.at = time.time()  # the sample's time, kept across restarts: the wall clock
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._drop(item.model, CaptureDrop.QUEUE_FULL)

    # -- counts -----------------------------------------------------------------------------

    def _counts(self, model: str) -> ModelCounts:
        return self.counts.setdefault(model, ModelCounts())

    def _drop(self, model: str, reason: CaptureDrop, n: int = 1) -> None:
        if n <= 0:
            return
        with self._lock:
            dropped = self._counts(model).dropped
            dropped[reason.value] = dropped.get(reason.value, 0) + n
        if self._metrics is not None:
            self._metrics.capture_dropped.labels(model, reason.value).inc(n)

    def uploaded(self, per_model: Mapping[str, int]) -> None:
        """Samples the control plane acknowledged (and the spool deleted)."""
        with self._lock:
            for model, n in per_model.items():
                self._counts(model).uploaded += n
        if self._metrics is not None:
            for model, n in per_model.items():
                self._metrics.capture_uploaded.labels(model).inc(n)

    def snapshot(self) -> dict[str, ModelCounts]:
        with self._lock:
            return {
                m: ModelCounts(dict(c.captured), c.uploaded, dict(c.dropped))
                for m, c in self.counts.items()
            }

    # -- the writer thread ------------------------------------------------------------------

    def close(self, timeout_s: float = 10.0) -> None:
        """Store what is queued, then stop the thread."""
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    def drain(self) -> None:
        """Wait until what is queued now is stored (tests, shutdown)."""
        self._queue.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self._store(item)
            except Exception:  # one sample lost, not the writer
                log.exception("capture failed")
                self._drop(item.model, CaptureDrop.UNSTORABLE)
            finally:
                self._queue.task_done()

    def _store(self, item: _Pending) -> None:
        data = encode(item.inputs, item.outputs, item.rows, item.batch)
        if len(data) > item.config.max_sample_bytes:
            self._drop(item.model, CaptureDrop.TOO_LARGE)
            return
        rows = len(item.rows) if item.rows is not None else _rows(item.inputs)
        sample = Sample(
            uuid.uuid4().hex, item.model, item.version, item.at, item.trigger, rows, data
        )
        try:
            evicted = self.spool.add(sample, item.config.max_disk_bytes)
            expired = self.spool.expire(item.model, item.config.retention_days)
        except Exception as exc:
            log.warning("captured sample not stored", extra={"error": str(exc)})
            self._drop(item.model, CaptureDrop.UNSTORABLE)
            return
        with self._lock:
            captured = self._counts(item.model).captured
            captured[item.trigger.value] = captured.get(item.trigger.value, 0) + 1
        if self._metrics is not None:
            self._metrics.capture_samples.labels(item.model, item.trigger.value).inc()
        self._drop(item.model, CaptureDrop.EVICTED, evicted)
        self._drop(item.model, CaptureDrop.EXPIRED, expired)
        if self.on_stored is not None:
            self.on_stored()


def _rows(inputs: Arrays) -> int:
    first = next(iter(inputs.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1
