"""Running one batch in an instance's thread: stack the requests' inputs, run them, split the
outputs by rows, and when a batch fails in a way one request's data may cause, run each request
again alone so that only the offender gets the error. The batcher (:mod:`agent.inference.batcher`)
forms the batches and hands the results back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from runtimes.base import Runtime, check_rows
from runtimes.errors import InferenceFailedError, InvalidInputError, RuntimeFailure

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class ItemResult:
    outputs: Arrays
    queue_s: float
    compute_s: float
    """The whole batch's time in its instance: stacking, the run and the split."""
    batch_rows: int
    input_s: float = 0.0
    """Of ``compute_s``, stacking the requests' inputs into the batch (Triton's
    ``compute_input``)."""
    output_s: float = 0.0
    """Of ``compute_s``, splitting the outputs by request (Triton's ``compute_output``)."""


def joined(
    futures: list[asyncio.Future[ItemResult]], dropped: Callable[[], None]
) -> asyncio.Future[ItemResult]:
    """One result for the pieces of a request split into several batches: their outputs
    concatenated, or the first piece's error. The pieces are cancelled when it is (then
    ``dropped`` is called, so the batcher drops those not run) or when one fails."""
    whole: asyncio.Future[ItemResult] = asyncio.get_running_loop().create_future()

    def piece_done(_: asyncio.Future[ItemResult]) -> None:
        if whole.done():
            return
        failed = next(
            (f.exception() for f in futures if f.done() and not f.cancelled() and f.exception()),
            None,
        )
        if failed is not None:
            whole.set_exception(failed)
            for f in futures:
                f.cancel()
            dropped()
        elif all(f.done() for f in futures):
            results = [f.result() for f in futures]
            outputs = {
                k: np.concatenate([r.outputs[k] for r in results]) for k in results[0].outputs
            }
            whole.set_result(
                ItemResult(
                    outputs,
                    queue_s=max(r.queue_s for r in results),
                    compute_s=sum(r.compute_s for r in results),
                    batch_rows=max(r.batch_rows for r in results),
                    input_s=sum(r.input_s for r in results),
                    output_s=sum(r.output_s for r in results),
                )
            )

    def whole_done(_: asyncio.Future[ItemResult]) -> None:
        if whole.cancelled():
            for f in futures:
                f.cancel()
            dropped()

    for f in futures:
        f.add_done_callback(piece_done)
    whole.add_done_callback(whole_done)
    return whole


# NOTE: the failures that may come from one request's data. InvalidInputError is a value the
# backend refused at run time (a string that is not UTF-8); InferenceFailedError is the backend
# failing while it ran valid-looking inputs (ONNX Runtime's Gather on an index past its table).
# Any other error is about the instance or the model (DeviceUnavailableError, a RuntimeFailure
# for a closed session, an exception no backend translated): running the requests again alone
# would fail each of them the same way, only later, so they fail at once.
_DATA_FAILURES: tuple[type[RuntimeFailure], ...] = (InvalidInputError, InferenceFailedError)


@dataclass(frozen=True)
class Ran:
    """What an instance's thread made of one batch."""

    results: list[Arrays | RuntimeFailure]
    """Per request, in order: its outputs or its error."""
    runs: list[tuple[int, float]]
    """(rows, seconds in the backend) of every execution: one, or one more per request after
    a failure."""
    input_s: float = 0.0
    """Seconds spent stacking the requests' inputs (0 for one request: nothing is copied)."""
    output_s: float = 0.0
    """Seconds spent splitting the outputs by request."""


def run_batch(name: str, runtime: Runtime, parts: list[Arrays], rows: list[int]) -> Ran:
    """Stack the requests' inputs, run them and split the outputs, in the instance's thread:
    the copy of a batch of images (2.4 MB for four 224x224 ones) is kept off the event loop.

    If a batch of several requests fails in a way that may come from one request's data, each
    request runs again alone, so that only the offender gets the error. That costs at most one
    run per request, once: a request that fails alone is not retried, and a failure of the
    instance during the singles fails the rest at once.
    """
    started = time.monotonic()
    if len(parts) == 1:
        result = _run_one(name, runtime, parts[0])
        return Ran([result], [(rows[0], time.monotonic() - started)])
    stacked = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    ran_from = time.monotonic()
    batch = _run_one(name, runtime, stacked)
    ran_until = time.monotonic()
    runs = [(sum(rows), ran_until - ran_from)]
    input_s = ran_from - started
    if not isinstance(batch, RuntimeFailure):
        try:  # outputs that cannot be split by rows: each request runs alone, below
            check_rows(name, batch, sum(rows))
        except InferenceFailedError as exc:
            batch = exc
    if not isinstance(batch, RuntimeFailure):
        offsets = np.cumsum([0, *rows])
        split: list[Arrays | RuntimeFailure] = [
            {k: v[offsets[i] : offsets[i + 1]] for k, v in batch.items()} for i in range(len(parts))
        ]
        return Ran(split, runs, input_s, time.monotonic() - ran_until)
    if not isinstance(batch, _DATA_FAILURES):
        return Ran([batch] * len(parts), runs, input_s)
    results: list[Arrays | RuntimeFailure] = []
    for part, part_rows in zip(parts, rows, strict=True):
        started = time.monotonic()
        result = _run_one(name, runtime, part)
        runs.append((part_rows, time.monotonic() - started))
        results.append(result)
        if isinstance(result, RuntimeFailure) and not isinstance(result, _DATA_FAILURES):
            results.extend([result] * (len(parts) - len(results)))  # the instance is gone
            break
    return Ran(results, runs, input_s)


def _run_one(name: str, runtime: Runtime, inputs: Arrays) -> Arrays | RuntimeFailure:
    try:
        return runtime.infer(inputs)
    except RuntimeFailure as exc:
        return exc
    except Exception as exc:  # a backend bug must not take the server down
        error = InferenceFailedError(f"{name}: {exc!r}")
        error.__cause__ = exc
        return error
