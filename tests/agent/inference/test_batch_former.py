"""The batch former on its own: no batcher, no threads, no sleeps. Every decision takes ``now``
as a number, so a test walks the clock by hand; futures come from an event loop that is never
run (their answers are read, their callbacks never fire)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from agent.errors import DeadlineExceededError, ShuttingDownError
from agent.inference.batch_former import MAX_HOLD_S, Batch, BatchFormer, Item, shape_key
from agent.inference.batch_run import Ran
from common.model_config import BatchingConfig


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def former(instances: int = 1, slots: int | None = None, **config: object) -> BatchFormer:
    return BatchFormer(
        "m",
        BatchingConfig(**config),  # type: ignore[arg-type]
        batched=True,
        instances=instances,
        slots=instances + 1 if slots is None else slots,
    )


def item(
    loop: asyncio.AbstractEventLoop,
    rows: int = 1,
    *,
    at: float = 0.0,
    priority: int = 1,
    width: int = 3,
    deadline: float | None = None,
) -> Item:
    inputs = {"x": np.zeros((rows, width), np.float32)}
    return Item(inputs, rows, shape_key(inputs, True), priority, deadline, at, loop.create_future())


def run(f: BatchFormer, batch: Batch, compute_s: float = 0.01) -> list[Batch]:
    """What the batcher does with a batch an instance ran: the former learns, then answers."""
    assert f.claim(batch)
    batch.ran = Ran([{} for _ in batch.items], [(batch.rows, compute_s)])
    batch.compute_s = compute_s
    f.ran(batch)
    return f.answered(batch)


def hand_out(f: BatchFormer, now: float) -> Batch:
    items = f.form(now)
    assert items is not None
    batch = f.batch_of(items)
    assert batch is not None
    f.hand_out(batch)
    return batch


def test_requests_of_one_shape_form_one_batch_up_to_the_size_limit(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=4, balance_batches=False)
    queued = [item(loop, 1, at=0.001 * n) for n in range(6)]
    for i in queued:
        f.enqueue(i)
    assert f.form(0.01) == queued[:4]
    assert f.form(0.01) == queued[4:]
    assert f.form(0.01) is None
    assert f.idle


def test_a_request_of_another_shape_waits_for_a_batch_of_its_own(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=8, balance_batches=False)
    a, b, c = item(loop, at=0.0), item(loop, at=0.1, width=5), item(loop, at=0.2)
    for i in (a, b, c):
        f.enqueue(i)
    assert f.form(1.0) == [a, c]
    assert f.form(1.0) == [b]


def test_the_queue_delay_holds_a_partial_batch_until_the_oldest_has_waited_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=4, max_queue_delay_us=5000)
    f.enqueue(first := item(loop, at=10.0))
    assert f.form(10.001) is None
    assert f.next_wake() == pytest.approx(10.005)
    f.enqueue(second := item(loop, at=10.002))
    assert f.form(10.004) is None
    assert f.form(10.005) == [first, second]
    assert f.next_wake() is None


def test_a_full_batch_does_not_wait_for_the_queue_delay(loop: asyncio.AbstractEventLoop) -> None:
    f = former(max_batch_size=2, max_queue_delay_us=1_000_000)
    f.enqueue(a := item(loop, at=0.0))
    f.enqueue(b := item(loop, at=0.0))
    assert f.form(0.0) == [a, b]


def test_a_preferred_size_runs_at_once_and_the_rest_waits(loop: asyncio.AbstractEventLoop) -> None:
    f = former(max_batch_size=8, preferred_batch_sizes=(2,), max_queue_delay_us=1_000_000)
    queued = [item(loop, at=0.0) for _ in range(3)]
    for i in queued:
        f.enqueue(i)
    assert f.form(0.0) == queued[:2]
    assert f.form(0.0) is None  # one left, not a preferred size, delay not over


def test_balancing_aims_at_half_of_what_is_queued_and_the_batch_that_just_ran(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=16)
    queued = [item(loop, at=0.0) for _ in range(4)]
    for i in queued:
        f.enqueue(i)
    first = hand_out(f, 0.0)  # nothing ran before: half of the 4 queued
    assert first.items == queued[:2]
    run(f, first)
    assert f.form(0.1) == queued[2:]  # half of 2 queued and 2 just run


def test_balancing_holds_a_lone_request_for_a_bounded_time_only(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=16)
    for _ in range(4):
        f.enqueue(item(loop, at=0.0))
    run(f, hand_out(f, 0.0), compute_s=1.0)  # slow batches: the hold is capped at MAX_HOLD_S
    run(f, hand_out(f, 0.1), compute_s=1.0)
    f.enqueue(lone := item(loop, at=1.0))
    assert f.form(1.0) is None  # aims at half of 1 + 2 rows, rounded up
    assert f.next_wake() == pytest.approx(1.0 + MAX_HOLD_S)
    assert f.form(1.0 + MAX_HOLD_S / 2) is None
    assert f.form(1.0 + MAX_HOLD_S) == [lone]
    assert f.next_wake() is None


def test_balancing_takes_the_aim_fixed_when_first_seen_not_all_that_came_since(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=16)
    for _ in range(4):
        f.enqueue(item(loop, at=0.0))
    run(f, hand_out(f, 0.0))
    run(f, hand_out(f, 0.0))  # the last batch had 2 rows
    f.enqueue(a := item(loop, at=1.0))
    assert f.form(1.0) is None  # aim: (1 + 2 + 1) // 2 = 2 rows
    f.enqueue(b := item(loop, at=1.001))
    f.enqueue(item(loop, at=1.002))
    assert f.form(1.002) == [a, b]


def test_a_higher_priority_goes_first_and_takes_back_a_batch_no_thread_started(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=1, priority_levels=2)
    f.enqueue(low := item(loop, priority=2, at=0.0))
    out = hand_out(f, 0.0)
    assert out.items == [low] and f.pending == 1
    f.enqueue(high := item(loop, priority=1, at=0.1))
    assert not f.claim(out)  # taken back before a thread could start it
    assert f.busy == 0
    assert f.form(0.2) == [high]
    assert f.form(0.2) == [low]


def test_a_started_batch_is_not_taken_back(loop: asyncio.AbstractEventLoop) -> None:
    f = former(max_batch_size=1, priority_levels=2)
    f.enqueue(item(loop, priority=2))
    out = hand_out(f, 0.0)
    assert f.claim(out)
    assert not f.withdraw()
    assert f.running == 1 and f.pending == 0


def test_a_request_past_its_deadline_is_answered_and_never_formed(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=4, max_queue_delay_us=1_000_000)
    f.enqueue(late := item(loop, at=0.0, deadline=0.05))
    f.enqueue(fine := item(loop, at=0.0))
    assert f.next_wake() == pytest.approx(0.05)
    f.expire(0.05)
    assert isinstance(late.future.exception(), DeadlineExceededError)
    assert "timeout of 50.0 ms" in str(late.future.exception())
    assert f.queued == 1
    assert f.form(1.0) == [fine]


def test_a_deadline_in_a_batch_no_thread_started_takes_it_back_first(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=2, balance_batches=False)
    f.enqueue(late := item(loop, at=0.0, deadline=0.05))
    f.enqueue(fine := item(loop, at=0.0))
    out = hand_out(f, 0.0)
    f.expire(0.06)
    assert not f.claim(out)
    assert isinstance(late.future.exception(), DeadlineExceededError)
    assert f.form(0.06) == [fine]


def test_a_request_given_up_is_dropped_at_the_next_expiry(loop: asyncio.AbstractEventLoop) -> None:
    f = former(max_batch_size=4, max_queue_delay_us=1_000_000)
    f.enqueue(gone := item(loop))
    f.enqueue(kept := item(loop))
    gone.future.cancel()
    f.given_up()
    f.expire(0.0)
    assert f.pending == 1
    assert f.form(10.0) == [kept]


def test_a_batch_whose_requests_were_all_given_up_is_not_handed_out(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=4, balance_batches=False)
    for _ in range(2):
        f.enqueue(item(loop))
    items = f.form(0.0)
    assert items is not None
    for i in items:
        i.future.cancel()
    assert f.batch_of(items) is None


def test_with_preserve_ordering_answers_wait_for_the_batches_before_them(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(instances=2, max_batch_size=1, preserve_ordering=True)
    f.enqueue(item(loop, at=0.0))
    f.enqueue(item(loop, at=0.1))
    first, second = hand_out(f, 0.2), hand_out(f, 0.2)
    assert run(f, second) == []  # ran first, answered after the first
    assert run(f, first) == [first, second]
    assert f.all_answered


def test_without_preserve_ordering_each_batch_is_answered_when_it_ran(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(instances=2, max_batch_size=1)
    f.enqueue(item(loop, at=0.0))
    f.enqueue(item(loop, at=0.1))
    first, second = hand_out(f, 0.2), hand_out(f, 0.2)
    assert run(f, second) == [second]
    assert not f.all_answered
    assert run(f, first) == [first]


def test_only_full_batches_queue_behind_busy_instances(loop: asyncio.AbstractEventLoop) -> None:
    f = former(instances=1, max_batch_size=2, balance_batches=False)
    f.enqueue(item(loop))
    hand_out(f, 0.0)
    f.enqueue(a := item(loop))
    assert f.form(0.0) is None  # partial, and the only instance is busy
    assert f.next_wake() is None
    f.enqueue(b := item(loop))
    assert f.has_room
    assert f.form(0.0) == [a, b]


def test_failing_what_waits_answers_every_request_and_empties_the_queues(
    loop: asyncio.AbstractEventLoop,
) -> None:
    f = former(max_batch_size=1)
    f.enqueue(out := item(loop))
    hand_out(f, 0.0)
    f.enqueue(queued := item(loop))
    f.fail_queued(lambda: ShuttingDownError("closing"))
    for i in (out, queued):
        assert isinstance(i.future.exception(), ShuttingDownError)
    assert f.pending == 0 and f.idle


def test_retry_after_grows_with_the_rows_queued(loop: asyncio.AbstractEventLoop) -> None:
    f = former(max_batch_size=4, max_queue_delay_us=1_000_000)
    for _ in range(2):
        f.enqueue(item(loop, 4))
    run(f, hand_out(f, 0.0), compute_s=2.0)  # 4 rows take about 2 s, once learnt
    few = f.retry_after_s()
    for _ in range(8):
        f.enqueue(item(loop, 4))
    assert f.retry_after_s() > few >= 1
