"""The iteration-level scheduler: which sequences run each step, who waits, what the KV cache
holds. A pure state machine: no I/O, no threads, no clock of its own (``now`` is passed in).

A sequence's life::

    submit -> WAITING --admit (a free slot, its tokens fit the KV budget)--> PREFILL
    PREFILL --one chunk of its prompt per step--> ... --last chunk (first token)--> DECODE
    DECODE --one token per step--> ... --max_tokens, stop or EOS--> FINISHED
    any state --cancel--> CANCELLED (slot and tokens freed at once)

Admission reserves a sequence's whole span (prompt + ``max_tokens``) against the KV budget, so
a running sequence never runs out of cache and is never preempted: preemption by recompute
would re-prefill generated tokens in chunk shapes, and greedy output would then depend on
whether a sequence was preempted, which breaks "the same alone or batched". The cost is a
budget sized for the worst case of each sequence (llama.cpp's slots make the same trade).

A sequence is admitted as it arrives if a slot is free and its span fits (it runs from the
next step); otherwise it waits. Waiting sequences are admitted by priority (1 first), then
arrival, without overtaking: the
head of the queue that does not fit holds the rest back, so a long request is not starved by
short ones. Each step prefills at most ``prefill_chunks_per_step`` chunks of
``prefill_chunk_tokens`` (vLLM's chunked prefill), oldest first, so a long prompt costs the
running streams one chunk of latency per step instead of its whole length. Chunk boundaries
depend on the sequence alone (``[0, C), [C, 2C), ...``), never on its companions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from agent.errors import OverloadedError


class SeqState(StrEnum):
    WAITING = "WAITING"
    PREFILL = "PREFILL"
    DECODE = "DECODE"
    FINISHED = "FINISHED"
    CANCELLED = "CANCELLED"


class KvBudgetFullError(OverloadedError):
    """The KV budget and the wait queue are both full: answered 429 with ``Retry-After``."""

    code = "kv_budget_full"


@dataclass
class Sequence:
    """The scheduler's view of one request: lengths and state, no tokens."""

    id: int
    prompt_len: int
    max_new: int
    priority: int
    arrived_s: float
    order: int
    state: SeqState = SeqState.WAITING
    slot: int = -1
    prefilled: int = 0
    """Prompt tokens whose KV is in the cache."""
    generated: int = 0
    waited: bool = False
    """Not admitted at the first step after it arrived (counted as deferred)."""

    @property
    def reserved(self) -> int:
        return self.prompt_len + self.max_new


@dataclass(frozen=True)
class Chunk:
    seq: int
    slot: int
    start: int
    end: int
    last: bool
    """The prompt's last chunk: its final logits give the first generated token."""


@dataclass(frozen=True)
class StepPlan:
    admitted: tuple[int, ...]
    prefill: tuple[Chunk, ...]
    decode: tuple[tuple[int, int], ...]
    """(sequence, slot) of every sequence decoding one token this step."""

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


@dataclass
class SchedulerCounts:
    admitted: int = 0
    deferred: int = 0
    """Sequences that had to wait for a slot or KV budget (llama.cpp's requests_deferred)."""
    refused: int = 0
    finished: int = 0
    cancelled: int = 0


@dataclass
class Scheduler:
    slots: int
    kv_budget_tokens: int
    max_waiting: int
    prefill_chunk_tokens: int
    prefill_chunks_per_step: int = 4
    retry_after_s: int = 1
    counts: SchedulerCounts = field(default_factory=SchedulerCounts)
    _seqs: dict[int, Sequence] = field(default_factory=dict)
    _waiting: list[Sequence] = field(default_factory=list)
    _free_slots: list[int] = field(default_factory=list)
    _kv_reserved: int = 0
    _order: int = 0

    def __post_init__(self) -> None:
        self._free_slots = list(range(self.slots - 1, -1, -1))

    # -- queries ---------------------------------------------------------------------------

    @property
    def running(self) -> int:
        return self.slots - len(self._free_slots)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_reserved_tokens(self) -> int:
        return self._kv_reserved

    @property
    def has_work(self) -> bool:
        return bool(self._seqs)

    def state(self, seq: int) -> SeqState | None:
        found = self._seqs.get(seq)
        return None if found is None else found.state

    def sequence(self, seq: int) -> Sequence | None:
        return self._seqs.get(seq)

    # -- events ----------------------------------------------------------------------------

    def submit(
        self, seq: int, prompt_len: int, max_new: int, now: float, priority: int = 1
    ) -> None:
        """Queue a sequence.

        Raises:
            ValueError: its span can never fit the KV budget, or it is empty (a caller's bug:
                the front end checks the context window first).
            KvBudgetFullError: the wait queue is full.
        """
        if prompt_len < 1 or max_new < 1 or prompt_len + max_new > self.kv_budget_tokens:
            raise ValueError(f"sequence of {prompt_len}+{max_new} tokens cannot be scheduled")
        if seq in self._seqs:
            raise ValueError(f"sequence {seq} is already scheduled")
        self._order += 1
        entry = Sequence(seq, prompt_len, max_new, priority, now, self._order)
        self._waiting.append(entry)
        self._waiting.sort(key=lambda s: (s.priority, s.order))
        self._admit()  # into a free slot at once: the queue holds only what cannot run
        if entry.state is SeqState.WAITING and len(self._waiting) > self.max_waiting:
            self._waiting.remove(entry)
            self.counts.refused += 1
            raise KvBudgetFullError(
                f"{self.running} sequences run and {len(self._waiting)} wait "
                f"(max_waiting_sequences={self.max_waiting}): retry later",
                retry_after_s=self.retry_after(),
            )
        self._seqs[seq] = entry

    def cancel(self, seq: int) -> bool:
        """Drop a sequence wherever it is; its slot and tokens are free at once."""
        entry = self._seqs.pop(seq, None)
        if entry is None:
            return False
        if entry.state is SeqState.WAITING:
            self._waiting.remove(entry)
        else:
            self._release(entry)
        entry.state = SeqState.CANCELLED
        self.counts.cancelled += 1
        return True

    def plan(self, now: float) -> StepPlan:
        """Admit what fits now (room freed since), then choose this step's prefill chunks and
        decoding sequences."""
        admitted = self._admit()
        for entry in self._waiting:
            if not entry.waited:
                entry.waited = True
                self.counts.deferred += 1
        running = sorted(
            (s for s in self._seqs.values() if s.state is not SeqState.WAITING),
            key=lambda s: s.order,
        )
        prefill = tuple(self._chunk(s) for s in running if s.state is SeqState.PREFILL)[
            : self.prefill_chunks_per_step
        ]
        decode = tuple((s.id, s.slot) for s in running if s.state is SeqState.DECODE)
        return StepPlan(tuple(admitted), prefill, decode)

    def advance(self, plan: StepPlan, finished: set[int]) -> list[int]:
        """Record a step's results: chunks prefilled, one token per decoding sequence (and per
        last chunk); ``finished`` are the sequences that stopped (EOS or a stop string). A
        sequence cancelled while the step ran is ignored. Returns the sequences freed."""
        freed = []
        for chunk in plan.prefill:
            entry = self._seqs.get(chunk.seq)
            if entry is None:
                continue
            entry.prefilled = chunk.end
            if chunk.last:
                entry.state = SeqState.DECODE
                entry.generated += 1
        for seq, _ in plan.decode:
            entry = self._seqs.get(seq)
            if entry is not None:
                entry.generated += 1
        for entry in list(self._seqs.values()):
            if entry.state is SeqState.DECODE and (
                entry.id in finished or entry.generated >= entry.max_new
            ):
                self._finish(entry)
                freed.append(entry.id)
        return freed

    def retry_after(self) -> int:
        """Seconds a refused client should wait: at least ``retry_after_s``."""
        return max(self.retry_after_s, math.ceil(self.waiting / max(1, self.slots)))

    # -- inside ----------------------------------------------------------------------------

    def _admit(self) -> list[int]:
        admitted = []
        while self._waiting and self._free_slots:
            head = self._waiting[0]
            if self._kv_reserved + head.reserved > self.kv_budget_tokens:
                break  # no overtaking: the head waits for room, the rest behind it
            self._waiting.pop(0)
            head.slot = self._free_slots.pop()
            head.state = SeqState.PREFILL
            self._kv_reserved += head.reserved
            self.counts.admitted += 1
            admitted.append(head.id)
        return admitted

    def _chunk(self, entry: Sequence) -> Chunk:
        end = min(entry.prefilled + self.prefill_chunk_tokens, entry.prompt_len)
        return Chunk(entry.id, entry.slot, entry.prefilled, end, end == entry.prompt_len)

    def _finish(self, entry: Sequence) -> None:
        self._seqs.pop(entry.id, None)
        self._release(entry)
        entry.state = SeqState.FINISHED
        self.counts.finished += 1

    def _release(self, entry: Sequence) -> None:
        # the lowest free slot goes first, so running sequences hold a contiguous run of
        # slots and a decode step reads their caches as one view (agent/generative/decoder.py)
        self._free_slots.append(entry.slot)
        self._free_slots.sort(reverse=True)
        self._kv_reserved -= entry.reserved
        entry.slot = -1
