"""Choosing the next token from a row of logits: greedy, or sampled with temperature, top-k,
top-p and a seed; presence and frequency penalties; stop strings.

Each sequence has its own :class:`Sampler` with its own random generator, so a seeded request
gives the same text whatever runs beside it. Penalties follow OpenAI's definition over the
tokens generated so far: ``logit - presence * (count > 0) - frequency * count``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GREEDY_BELOW = 1e-5
"""A temperature under this samples greedily."""


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the token choice; validated by the front end."""

    max_tokens: int
    temperature: float = 1.0
    """0 is greedy (the most likely token, deterministic)."""
    top_p: float = 1.0
    top_k: int = 0
    """0 keeps every token."""
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        # below this, dividing the logits overflows to inf - inf = NaN; vLLM draws the same
        # line (its _SAMPLING_EPS)
        return self.temperature < GREEDY_BELOW or self.top_k == 1


class Sampler:
    """The token choice of one sequence."""

    def __init__(self, params: SamplingParams, vocab: int) -> None:
        self.params = params
        # numpy takes non-negative seeds only; OpenAI's are any int64
        seed = None if params.seed is None else params.seed % 2**64
        self.rng = np.random.default_rng(seed)
        self.counts = np.zeros(vocab, dtype=np.float32)

    def choose(self, logits: np.ndarray) -> int:
        p = self.params
        if p.presence_penalty or p.frequency_penalty:
            logits = (
                logits - p.presence_penalty * (self.counts > 0) - p.frequency_penalty * self.counts
            )
        if p.greedy:
            token = int(np.argmax(logits))
        else:
            token = self._sample(logits.astype(np.float64) / p.temperature)
        self.counts[token] += 1
        return token

    def _sample(self, logits: np.ndarray) -> int:
        p = self.params
        order = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            order = order[: p.top_k]
        chosen = logits[order]
        probs = np.exp(chosen - chosen[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            # the smallest head of the ranking whose mass reaches top_p (at least one token)
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        return int(order[self.rng.choice(len(order), p=probs)])


def stop_cut(text: str, stop: tuple[str, ...]) -> int | None:
    """Where the first stop string starts in ``text``; None if none occurs."""
    found = [i for s in stop if (i := text.find(s)) >= 0]
    return min(found) if found else None


def held_back(text: str, stop: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` could begin a stop string (not yet sent to a
    streaming client, since the next token may complete it), or end in half a character."""
    hold = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    if text.endswith("\ufffd"):  # a multi-byte character split across tokens
        hold = max(hold, 1)
    return hold
