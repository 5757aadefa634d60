"""Payload logging (KServe's logger is the anchor): for the models whose config opts in
(``[payload_log] enabled``), a sampled record of each answered request's input and output
tensors, as digests (datatype, shape, SHA-256) or with their data up to a size, written as
JSON lines to a local file (rotated by size) and/or POSTed in batches to an HTTP sink.

It never blocks a request: the event loop only draws the sample and puts references to the
arrays in a bounded queue (the arrays are not written to after they are answered); one thread
digests, encodes and writes. A full queue drops the record and counts it
(``edgefleet_payload_records_dropped_total``), as does a sink that fails (the file's error or
the HTTP status is logged once a minute, not per record).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import queue
import random
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.model_config import PayloadLogConfig, PayloadLogMode

if TYPE_CHECKING:  # httpx (and what it imports) only where a sink is an HTTP URL
    import httpx

log = logging.getLogger("edgefleet.agent.payload_log")
BATCH_RECORDS = 100
"""Records sent in one POST to the HTTP sink, at most."""
FLUSH_S = 1.0
"""A partial batch waits at most this long for the HTTP sink."""
_STOP = object()


def tensor_record(array: np.ndarray, config: PayloadLogConfig) -> dict[str, Any]:
    """One tensor as logged: its datatype, shape and SHA-256, and in ``tensors`` mode its bytes
    (base64, C order) where they fit ``max_tensor_bytes``."""
    if array.dtype == object:  # BYTES: each element's bytes, length-prefixed as V2 does
        raw = b"".join(
            len(b).to_bytes(4, "little") + b
            for b in (x if isinstance(x, bytes) else str(x).encode() for x in array.ravel())
        )
    else:
        raw = np.ascontiguousarray(array).tobytes()
    record: dict[str, Any] = {
        "datatype": str(array.dtype),
        "shape": list(array.shape),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }
    if config.mode is PayloadLogMode.TENSORS and len(raw) <= config.max_tensor_bytes:
        record["data_b64"] = base64.b64encode(raw).decode()
    return record


class PayloadLog:
    """The queue and the writer thread; :meth:`offer` is called on the event loop."""

    def __init__(
        self,
        path: Path | None,
        url: str | None,
        *,
        max_file_bytes: int,
        queue_records: int,
        on_drop: Any = None,
    ) -> None:
        self.path, self.url, self.max_file_bytes = path, url, max_file_bytes
        self._queue: queue.Queue[Any] = queue.Queue(queue_records)
        self._on_drop = on_drop
        self.dropped = 0
        self.written = 0
        self._last_complaint = 0.0
        self._thread = threading.Thread(target=self._run, name="payload-log", daemon=True)
        self._thread.start()

    def offer(
        self,
        model: str,
        version: str,
        config: PayloadLogConfig,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray],
    ) -> None:
        """Queue a record of one answered request, if the sample draws it and there is room."""
        if config.sample_ratio < 1.0 and random.random() >= config.sample_ratio:
            return
        item = (time.time(), model, version, config, dict(inputs), dict(outputs))
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._drop(1)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then stop the thread."""
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    def _drop(self, count: int) -> None:
        self.dropped += count
        if self._on_drop is not None:
            self._on_drop(count)

    def _record(self, item: tuple[Any, ...]) -> dict[str, Any]:
        when, model, version, config, inputs, outputs = item
        return {
            "time": datetime.fromtimestamp(when, UTC).isoformat(),
            "model": model,
            "version": version,
            "inputs": {k: tensor_record(v, config) for k, v in inputs.items()},
            "outputs": {k: tensor_record(v, config) for k, v in outputs.items()},
        }

    def _run(self) -> None:
        batch: list[dict[str, Any]] = []
        client = None
        if self.url:
            import httpx

            client = httpx.Client(timeout=10)
        deadline = time.monotonic() + FLUSH_S
        try:
            while True:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    item = None
                if item is _STOP:
                    break
                if item is not None:
                    batch.append(self._record(item))
                if batch and (len(batch) >= BATCH_RECORDS or time.monotonic() >= deadline):
                    self._write(batch, client)
                    batch = []
                if time.monotonic() >= deadline:
                    deadline = time.monotonic() + FLUSH_S
            if batch:
                self._write(batch, client)
        finally:
            if client is not None:
                client.close()

    def _write(self, batch: list[dict[str, Any]], client: httpx.Client | None) -> None:
        failed = None
        if self.path is not None:
            try:
                self._append(batch)
            except OSError as exc:
                failed = f"{self.path}: {exc}"
        if client is not None and self.url is not None:
            import httpx

            try:
                response = client.post(self.url, json=batch)
                if response.status_code >= 300:
                    failed = f"{self.url}: HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                failed = f"{self.url}: {exc!r}"
        if failed is None:
            self.written += len(batch)
            return
        self._drop(len(batch))
        if time.monotonic() - self._last_complaint >= 60:
            self._last_complaint = time.monotonic()
            log.warning("payload records dropped", extra={"error": failed, "records": len(batch)})

    def _append(self, batch: list[dict[str, Any]]) -> None:
        assert self.path is not None
        if self.path.exists() and self.path.stat().st_size >= self.max_file_bytes:
            self.path.replace(self.path.with_name(self.path.name + ".1"))  # one kept
        with self.path.open("a", encoding="utf-8") as out:
            out.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in batch)
