"""The batcher on its own, with fake runtimes (our interface, no backend): shape grouping,
error isolation (a failed batch run again one request at a time), preferred sizes, row checks,
closing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from agent.errors import ShuttingDownError
from agent.inference.batch_run import ItemResult
from agent.inference.batcher import Batcher
from common.model_config import BatchingConfig
from runtimes.base import Placement, Runtime
from runtimes.errors import DeviceUnavailableError, InferenceFailedError, RuntimeFailure
from runtimes.signature import ModelSignature, TensorSpec


class EchoRuntime(Runtime):
    """Doubles its input; takes [N, D] with D dynamic; records batch shapes; can be held."""

    name = "onnxruntime"
    formats = frozenset()

    def __init__(
        self,
        fail_on_negative: bool = False,
        one_row_out: bool = False,
        compute_s: float = 0.0,
        failure: type[RuntimeFailure] = InferenceFailedError,
    ) -> None:
        super().__init__()
        self.batches: list[tuple[int, ...]] = []
        self.fail_on_negative, self.one_row_out = fail_on_negative, one_row_out
        self.failure = failure
        self.compute_s = compute_s
        self.hold = threading.Event()
        self.hold.set()
        self._signature = ModelSignature(
            inputs=(TensorSpec(name="x", datatype="FP32", shape=(-1, -1)),),
            outputs=(TensorSpec(name="y", datatype="FP32", shape=(-1, -1)),),
        )

    def _load(self, model_file: Path, placement: Placement) -> ModelSignature:
        return self.signature

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.hold.wait(10)
        time.sleep(self.compute_s)
        x = inputs["x"]
        self.batches.append(x.shape)
        if self.fail_on_negative and (x < 0).any():
            raise self.failure("negative input")
        y = x * 2
        # one_row_out: one row whatever the rows in, as NonZero's output is not the batch
        return {"y": y.sum(axis=0, keepdims=True) if self.one_row_out else y}

    def _close(self) -> None:
        pass


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def _submit_all(batcher: Batcher, arrays: list[np.ndarray]) -> list[object]:
    return await asyncio.gather(
        *(batcher.infer({"x": a}, len(a), priority=1, timeout_s=None) for a in arrays),
        return_exceptions=True,
    )


def _held_batcher(runtime: EchoRuntime, **config: object) -> Batcher:
    return Batcher("echo", [runtime], BatchingConfig(**config), batched=True)  # type: ignore[arg-type]


async def _hold_then_release(
    batcher: Batcher, runtime: EchoRuntime, arrays: list[np.ndarray]
) -> list[object]:
    """Occupy the only instance, queue ``arrays`` behind it, then let everything run."""
    runtime.hold.clear()
    first = asyncio.ensure_future(
        batcher.infer({"x": np.ones((1, 4), np.float32)}, 1, priority=1, timeout_s=None)
    )
    while runtime.hold.is_set() or not batcher.running:
        await asyncio.sleep(0)
    rest = asyncio.ensure_future(_submit_all(batcher, arrays))
    while batcher.pending < len(arrays):
        await asyncio.sleep(0.001)
    runtime.hold.set()
    await first
    return await rest


def test_only_requests_with_the_same_non_batch_shape_share_a_batch() -> None:
    async def main() -> None:
        rt = EchoRuntime()
        # without balancing: the three same-shaped requests form one batch however they came
        b = _held_batcher(rt, max_batch_size=16, balance_batches=False)
        b.start()
        arrays = [np.full((1, 4), i, np.float32) for i in range(3)] + [
            np.full((2, 8), 9, np.float32)
        ]
        results = await _hold_then_release(b, rt, arrays)
        await b.close()
        assert rt.batches[1:] == [(3, 4), (2, 8)]
        for a, r in zip(arrays, results, strict=True):
            np.testing.assert_array_equal(r.outputs["y"], a * 2)  # type: ignore[attr-defined]

    run(main())


def test_a_failing_batch_fails_only_the_request_at_fault() -> None:
    async def main() -> None:
        rt = EchoRuntime(fail_on_negative=True)
        b = _held_batcher(rt, max_batch_size=2)
        b.start()
        arrays = [np.full((1, 4), v, np.float32) for v in (1, -1, 2, 3)]  # batches: [1,-1] [2,3]
        results = await _hold_then_release(b, rt, arrays)
        await b.close()
        assert isinstance(results[1], InferenceFailedError)
        for i in (0, 2, 3):
            np.testing.assert_array_equal(results[i].outputs["y"], arrays[i] * 2)  # type: ignore[union-attr]
        # the failed batch ran again one request at a time, once; the other batch as one
        assert rt.batches[1:] == [(2, 4), (1, 4), (1, 4), (2, 4)]
        assert b.rerun_batches == 1
        assert results[0].batch_rows == 1 and results[2].batch_rows == 2  # type: ignore[union-attr]

    run(main())


def test_a_batch_times_its_stacking_its_run_and_its_split_apart() -> None:
    """Triton's compute_input, compute_infer and compute_output: each request of a batch gets
    the batch's three durations, the observer each execution's; one request alone is copied
    neither in nor out."""

    async def main() -> None:
        rt = EchoRuntime()
        seen: list[tuple[int, float, float, float]] = []
        b = Batcher(
            "echo",
            [rt],
            BatchingConfig(max_batch_size=2),
            batched=True,
            observer=lambda *timing: seen.append(timing),
        )
        b.start()
        arrays = [np.full((1, 4), v, np.float32) for v in (1, 2)]
        results = await _hold_then_release(b, rt, arrays)
        await b.close()
        assert [rows for rows, *_ in seen] == [1, 2]
        (_, _, alone_in, alone_out), (_, run_s, input_s, output_s) = seen
        assert alone_in == alone_out == 0.0 and run_s > 0 and input_s > 0 and output_s > 0
        for result in results:
            assert isinstance(result, ItemResult), result
            assert (result.input_s, result.output_s) == (input_s, output_s)
            assert result.compute_s >= input_s + run_s + output_s

    run(main())


def test_a_failure_of_the_instance_fails_the_whole_batch_without_running_it_again() -> None:
    async def main() -> None:
        rt = EchoRuntime(fail_on_negative=True, failure=DeviceUnavailableError)
        b = _held_batcher(rt, max_batch_size=2)
        b.start()
        arrays = [np.full((1, 4), v, np.float32) for v in (1, -1)]
        results = await _hold_then_release(b, rt, arrays)
        (alone,) = await _submit_all(b, [np.full((1, 4), -1, np.float32)])
        await b.close()
        assert all(isinstance(r, DeviceUnavailableError) for r in results)
        assert isinstance(alone, DeviceUnavailableError)
        assert rt.batches[1:] == [(2, 4), (1, 4)] and b.rerun_batches == 0

    run(main())


def test_a_request_that_fails_alone_is_not_run_again() -> None:
    async def main() -> None:
        rt = EchoRuntime(fail_on_negative=True)
        b = _held_batcher(rt, max_batch_size=4)
        b.start()
        (result,) = await _submit_all(b, [np.full((3, 4), -1, np.float32)])
        await b.close()
        assert isinstance(result, InferenceFailedError)
        assert rt.batches == [(3, 4)] and b.rerun_batches == 0

    run(main())


def test_preferred_batch_size_runs_without_waiting_the_delay() -> None:
    async def main() -> None:
        rt = EchoRuntime()
        # a delay of a minute: only a preferred size (or a full batch) can start a batch
        b = _held_batcher(
            rt, max_batch_size=16, preferred_batch_sizes=(4,), max_queue_delay_us=60_000_000
        )
        b.start()
        arrays = [np.ones((1, 4), np.float32) for _ in range(4)]
        results = await asyncio.wait_for(_submit_all(b, arrays), 30)
        await b.close()
        assert rt.batches == [(4, 4)] and all(not isinstance(r, Exception) for r in results)

    run(main())


def test_queue_delay_waits_for_more_requests() -> None:
    async def main() -> None:
        rt = EchoRuntime()
        b = _held_batcher(rt, max_batch_size=8, max_queue_delay_us=200_000)
        b.start()
        first = asyncio.ensure_future(
            b.infer({"x": np.ones((1, 4), np.float32)}, 1, priority=1, timeout_s=None)
        )
        await asyncio.sleep(0.02)  # within the 200 ms delay, a second request arrives
        second = await b.infer({"x": np.ones((1, 4), np.float32)}, 1, priority=1, timeout_s=None)
        await first
        await b.close()
        assert rt.batches == [(2, 4)] and second.batch_rows == 2

    run(main())


def test_outputs_that_cannot_be_split_by_rows_are_not_split_across_requests() -> None:
    async def main() -> None:
        rt = EchoRuntime(one_row_out=True)
        b = _held_batcher(rt, max_batch_size=8, balance_batches=False)
        b.start()
        arrays = [np.full((1, 4), v, np.float32) for v in (1, 2, 3)]
        results = await _hold_then_release(b, rt, arrays)
        await b.close()
        # one row out for three in: each request ran again alone and got its own answer
        assert rt.batches[1:] == [(3, 4), (1, 4), (1, 4), (1, 4)] and b.rerun_batches == 1
        for a, r in zip(arrays, results, strict=True):
            np.testing.assert_array_equal(r.outputs["y"], a * 2)  # type: ignore[attr-defined]

    run(main())


def test_close_fails_waiting_requests_and_refuses_new_ones() -> None:
    async def main() -> None:
        rt = EchoRuntime()
        b = _held_batcher(rt, max_batch_size=1)
        b.start()
        rt.hold.clear()
        running = asyncio.ensure_future(
            b.infer({"x": np.ones((1, 4), np.float32)}, 1, priority=1, timeout_s=None)
        )
        while not b.running:
            await asyncio.sleep(0.001)
        waiting = asyncio.ensure_future(
            b.infer({"x": np.ones((1, 4), np.float32)}, 1, priority=1, timeout_s=None)
        )
        while not b.pending:
            await asyncio.sleep(0.001)
        closing = asyncio.ensure_future(b.close())
        await asyncio.sleep(0.01)
        rt.hold.set()
        await closing
        assert (await running).outputs["y"].shape == (1, 4)  # the running batch finished
        with pytest.raises(ShuttingDownError):
            await waiting
        with pytest.raises(ShuttingDownError):
            await b.infer({"x": np.ones((1, 4), np.float32)}, 1, priority=1, timeout_s=None)

    run(main())


async def _closed_loop(batcher: Batcher, runtime: EchoRuntime, clients: int, rounds: int) -> None:
    """``clients`` that each send a request, wait for its answer, take a millisecond (the trip
    back over HTTP) and send the next. One starts alone; the others join while its first
    request runs, so the loop begins as one lone request and a group of the rest."""

    async def client(first: asyncio.Future[None] | None) -> None:
        if first is not None:
            await first
        for _ in range(rounds):
            await batcher.infer({"x": np.ones((1, 4), np.float32)}, 1, priority=1, timeout_s=None)
            await asyncio.sleep(0.001)

    runtime.hold.clear()
    started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    tasks = [asyncio.ensure_future(client(None))]
    while not batcher.running:
        await asyncio.sleep(0.001)
    tasks += [asyncio.ensure_future(client(started)) for _ in range(clients - 1)]
    started.set_result(None)
    while batcher.pending < clients - 1:
        await asyncio.sleep(0.001)
    runtime.hold.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)


@pytest.mark.slow
@pytest.mark.parametrize("balance", [True, False])
def test_a_closed_loop_of_clients_settles_into_equal_batches_only_with_balancing(
    balance: bool,
) -> None:
    """8 clients, one instance, a batch costs 40 ms whatever its size: without balancing the
    lone request stays alone (1, 7, 1, 7...); with it, two groups of 4 alternate."""

    async def main() -> None:
        rt = EchoRuntime(compute_s=0.04)
        b = _held_batcher(rt, max_batch_size=32, balance_batches=balance)
        b.start()
        await _closed_loop(b, rt, clients=8, rounds=10)
        await b.close()
        rows = [shape[0] for shape in rt.batches]
        assert sum(rows) == 8 * 10
        tail = rows[-10:]
        if balance:
            assert sum(r == 4 for r in tail) >= 8, rows
        else:
            assert sum(r in (1, 7) for r in tail) >= 8, rows

    run(main())


def test_balancing_holds_a_lone_request_for_a_bounded_time_only() -> None:
    """After a burst of 8 (run as two batches of 4, one computing while the other would cross
    HTTP), a single client's request waits for company that never comes: it runs once the
    hold (a quarter of the 40 ms batch) is over, and the next ones at once."""

    async def main() -> None:
        rt = EchoRuntime(compute_s=0.04)
        b = _held_batcher(rt, max_batch_size=32)
        b.start()
        await _submit_all(b, [np.ones((1, 4), np.float32) for _ in range(8)])
        assert [shape[0] for shape in rt.batches] == [4, 4]
        lone = [
            await b.infer({"x": np.ones((1, 4), np.float32)}, 1, priority=1, timeout_s=None)
            for _ in range(3)
        ]
        await b.close()
        assert [r.batch_rows for r in lone] == [1, 1, 1]
        # held once, by at most the hold, then not at all: the last batch was of one row
        assert lone[0].queue_s >= 0.25 * 0.04 * 0.5
        assert lone[1].queue_s < lone[0].queue_s and lone[2].queue_s < lone[0].queue_s

    run(main())


@pytest.mark.parametrize("config", [{"max_batch_size": 0}, {"max_batch_size": 2}])
def test_a_full_batch_queued_behind_the_running_one_starts_without_the_event_loop(
    config: dict[str, int],
) -> None:
    """The thread that finishes claims the next full batch itself: with the event loop blocked
    (as it is while it receives a large request), the instance does not sit idle."""

    async def main() -> None:
        rt = EchoRuntime()
        b = Batcher("echo", [rt], BatchingConfig(**config), batched=True)  # type: ignore[arg-type]
        b.start()
        rt.hold.clear()
        rows = max(config["max_batch_size"], 1)
        first, second = (
            asyncio.ensure_future(
                b.infer({"x": np.full((rows, 4), i, np.float32)}, rows, priority=1, timeout_s=None)
            )
            for i in (1, 2)
        )
        while not (b.running == 1 and b.pending == 1):
            await asyncio.sleep(0.001)
        rt.hold.set()
        blocked_until = time.monotonic() + 5
        while len(rt.batches) < 2 and time.monotonic() < blocked_until:
            time.sleep(0.001)  # the event loop is blocked: only the thread can start the batch
        assert rt.batches == [(rows, 4), (rows, 4)]
        assert (await second).outputs["y"][0, 0] == 4.0
        assert (await first).outputs["y"][0, 0] == 2.0
        await b.close()

    run(main())


def test_a_batch_queued_behind_the_running_one_is_not_formed_before_it_is_full() -> None:
    """With batching, requests queued while every instance computes wait in the queue, to be
    batched together when one frees (a queued batch would take the first alone)."""

    async def main() -> None:
        rt = EchoRuntime()
        b = _held_batcher(rt, max_batch_size=4, balance_batches=False)
        b.start()
        arrays = [np.full((1, 4), i, np.float32) for i in range(3)]
        await _hold_then_release(b, rt, arrays)
        await b.close()
        assert rt.batches == [(1, 4), (3, 4)]

    run(main())


class ThreadRecordingRuntime(EchoRuntime):
    """An EchoRuntime that records the thread each batch ran in."""

    def __init__(self, compute_s: float = 0.0) -> None:
        super().__init__(compute_s=compute_s)
        self.threads: list[str] = []

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.threads.append(threading.current_thread().name)
        return super()._run(inputs)


def _one_at_a_time(batcher: Batcher, count: int) -> list[object]:
    async def go() -> list[object]:
        batcher.start()
        try:
            rng = np.random.default_rng(1)
            return [
                await batcher.infer(
                    {"x": rng.standard_normal((1, 3)).astype(np.float32)},
                    1,
                    priority=1,
                    timeout_s=None,
                )
                for _ in range(count)
            ]
        finally:
            await batcher.close()

    return run(go())


def test_a_lone_fast_request_runs_on_the_event_loop_once_its_shape_was_timed() -> None:
    runtime = ThreadRecordingRuntime()
    batcher = Batcher(
        "echo",
        [runtime],
        BatchingConfig(),
        batched=True,
        inline_max_s=0.5,  # type: ignore[list-item]
    )
    results = _one_at_a_time(batcher, 3)
    # the first run of a shape is timed in the instance's thread, the next ones run on the loop
    assert runtime.threads[0] == "echo-0"
    assert runtime.threads[1:] == [threading.main_thread().name] * 2
    rng = np.random.default_rng(1)
    for result in results:
        x = rng.standard_normal((1, 3)).astype(np.float32)
        np.testing.assert_array_equal(result.outputs["y"], x * 2)  # type: ignore[attr-defined]
        assert result.batch_rows == 1  # type: ignore[attr-defined]


def test_a_slow_request_or_a_batcher_without_the_limit_stays_on_the_threads() -> None:
    slow = ThreadRecordingRuntime(compute_s=0.01)
    batcher = Batcher(
        "echo",
        [slow],
        BatchingConfig(),
        batched=True,
        inline_max_s=0.005,  # type: ignore[list-item]
    )
    _one_at_a_time(batcher, 3)
    assert slow.threads == ["echo-0"] * 3
    fast = ThreadRecordingRuntime()
    _one_at_a_time(Batcher("echo", [fast], BatchingConfig(), batched=True), 3)  # type: ignore[list-item]
    assert fast.threads == ["echo-0"] * 3


def test_requests_that_come_together_still_batch_in_the_threads_with_the_limit() -> None:
    runtime = ThreadRecordingRuntime()
    batcher = Batcher(
        "echo",
        [runtime],  # type: ignore[list-item]
        BatchingConfig(balance_batches=False),
        batched=True,
        inline_max_s=0.5,
    )

    async def go() -> list[object]:
        batcher.start()
        try:
            row = np.ones((1, 3), np.float32)
            await batcher.infer({"x": row}, 1, priority=1, timeout_s=None)  # its shape timed
            return await _submit_all(batcher, [row] * 4)
        finally:
            await batcher.close()

    results = run(go())
    assert runtime.batches == [(1, 3), (4, 3)] and runtime.threads == ["echo-0"] * 2
    assert all(r.batch_rows == 4 for r in results)  # type: ignore[attr-defined]
