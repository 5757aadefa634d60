"""The scheduler as a pure state machine: property tests over random arrivals, lengths,
cancellations and stops, with an explicit clock and no model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.generative.scheduler import KvBudgetFullError, Scheduler, SeqState


@dataclass
class Arrival:
    at_step: int
    prompt: int
    max_new: int
    priority: int
    cancel_after: int | None
    stop_after: int | None


arrivals = st.lists(
    st.builds(
        Arrival,
        at_step=st.integers(0, 30),
        prompt=st.integers(1, 90),
        max_new=st.integers(1, 20),
        priority=st.integers(1, 2),
        cancel_after=st.none() | st.integers(0, 25),
        stop_after=st.none() | st.integers(1, 20),
    ),
    max_size=40,
)


def make(slots: int = 4, budget: int = 256, waiting: int = 8, chunk: int = 16) -> Scheduler:
    return Scheduler(
        slots=slots, kv_budget_tokens=budget, max_waiting=waiting, prefill_chunk_tokens=chunk
    )


@settings(max_examples=80, deadline=None)
@given(arrivals, st.integers(1, 6), st.integers(110, 400), st.integers(0, 10), st.integers(1, 40))
def test_invariants_hold_over_random_traffic(
    traffic: list[Arrival], slots: int, budget: int, waiting: int, chunk: int
) -> None:
    s = make(slots, budget, waiting, chunk)
    submitted: dict[int, Arrival] = {}
    steps_run: dict[int, int] = {}
    prefilled_upto: dict[int, int] = {}
    generated: dict[int, int] = {}
    refused = 0
    last_arrival = max((a.at_step for a in traffic), default=0)
    for step in range(20_000):
        if step > last_arrival and not s.has_work:
            break
        for n, a in enumerate(traffic):
            if a.at_step == step:
                try:
                    s.submit(n, a.prompt, a.max_new, float(step), a.priority)
                    submitted[n] = a
                except KvBudgetFullError:
                    refused += 1
                    assert s.waiting == waiting  # refused only when the queue is full
        for n, a in submitted.items():
            if a.cancel_after is not None and steps_run.get(n, 0) == a.cancel_after:
                s.cancel(n)
        plan = s.plan(float(step))
        running_ids = [c.seq for c in plan.prefill] + [q for q, _ in plan.decode]
        # one chunk per sequence per step; slots distinct; budget and slots respected
        assert len(running_ids) == len(set(running_ids))
        slots_used = [c.slot for c in plan.prefill] + [slot for _, slot in plan.decode]
        assert len(slots_used) == len(set(slots_used)) and all(0 <= x < slots for x in slots_used)
        assert s.running <= slots and s.kv_reserved_tokens <= budget
        assert len(plan.prefill) <= s.prefill_chunks_per_step
        for chunk_ in plan.prefill:
            # chunk boundaries depend on the sequence alone: [0, C), [C, 2C), ...
            assert chunk_.start == prefilled_upto.get(chunk_.seq, 0)
            assert chunk_.start % chunk == 0 and chunk_.end - chunk_.start <= chunk
            prefilled_upto[chunk_.seq] = chunk_.end
        stopped = set()
        for q in running_ids:
            steps_run[q] = steps_run.get(q, 0) + 1
        for q, _ in plan.decode:
            generated[q] = generated.get(q, 0) + 1
        for c in plan.prefill:
            if c.last:
                generated[c.seq] = 1
        for q, g in generated.items():
            stop = submitted[q].stop_after
            if stop is not None and g >= stop and s.state(q) is SeqState.DECODE:
                stopped.add(q)
        s.advance(plan, stopped)
        for q, g in generated.items():
            assert g <= submitted[q].max_new  # never past max_tokens
    # everything ends: no sequence, slot or token is left behind
    assert not s.has_work, [s.state(n) for n in submitted]
    assert s.running == 0 and s.waiting == 0 and s.kv_reserved_tokens == 0
    c = s.counts
    assert c.admitted <= len(submitted)
    assert c.finished + c.cancelled == len(submitted)
    assert c.refused == refused


def test_a_new_sequence_joins_at_the_next_step_while_others_decode() -> None:
    s = make(slots=2, chunk=8)
    s.submit(1, 4, 10, 0.0)
    assert s.state(1) is SeqState.PREFILL  # a free slot: admitted as it arrives
    plan = s.plan(0.0)
    assert plan.prefill[0].seq == 1 and plan.prefill[0].last
    s.advance(plan, set())
    s.submit(2, 4, 10, 1.0)
    plan = s.plan(1.0)
    assert [q for q, _ in plan.decode] == [1] and plan.prefill[0].seq == 2
    assert s.counts.deferred == 0


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_decodes() -> None:
    s = make(slots=2, chunk=8)
    s.submit(1, 3, 50, 0.0)
    s.advance(s.plan(0.0), set())
    s.submit(2, 30, 5, 1.0)
    for step in range(4):  # ceil(30 / 8) chunks, one per step, while 1 decodes each step
        plan = s.plan(1.0 + step)
        assert [q for q, _ in plan.decode] == [1]
        assert plan.prefill[0].seq == 2 and plan.prefill[0].last == (step == 3)
        s.advance(plan, set())
    assert s.state(2) is SeqState.DECODE


def test_cancel_frees_the_slot_and_tokens_at_once() -> None:
    s = make(slots=1, budget=100)
    s.submit(1, 10, 50, 0.0)
    s.submit(2, 10, 50, 0.0)
    plan = s.plan(0.0)
    assert plan.prefill[0].seq == 1 and s.waiting == 1
    assert s.cancel(1) and s.running == 0 and s.kv_reserved_tokens == 0
    s.advance(plan, set())  # what the step computed for 1 is ignored
    assert s.plan(1.0).admitted == (2,)
    assert not s.cancel(1)


def test_the_head_of_the_queue_is_not_overtaken() -> None:
    s = make(slots=4, budget=100)
    s.submit(1, 50, 40, 0.0)  # 90 of 100 reserved
    s.submit(2, 20, 20, 1.0)  # does not fit beside 1
    s.submit(3, 2, 2, 2.0)  # would fit, but waits behind 2
    assert s.plan(1.0).admitted == () and s.waiting == 2
    assert s.counts.deferred == 2


def test_priority_one_is_admitted_first() -> None:
    s = make(slots=1)
    s.submit(1, 2, 2, 0.0)
    s.submit(2, 2, 2, 1.0, priority=2)
    s.submit(3, 2, 2, 2.0, priority=1)
    s.cancel(1)
    assert s.plan(2.0).admitted == (3,)


def test_a_full_wait_queue_refuses_with_retry_after() -> None:
    s = make(slots=1, waiting=1)
    s.submit(1, 2, 2, 0.0)
    s.submit(2, 2, 2, 0.0)
    with pytest.raises(KvBudgetFullError) as refused:
        s.submit(3, 2, 2, 0.0)
    assert refused.value.retry_after_s >= 1 and refused.value.code == "kv_budget_full"


def test_a_sequence_that_can_never_fit_is_a_caller_bug() -> None:
    with pytest.raises(ValueError):
        make(budget=64).submit(1, 60, 10, 0.0)
