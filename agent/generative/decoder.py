"""The model call of a generative version: a causal decoder on a :class:`~runtimes.base.Runtime`
(placed by the hardware profile like any model), with the KV cache of every slot.

Batch invariance by design: a row's past always has a length that depends on the row alone, so
its attention reduces over the same length in the same order whatever its companions hold. A
prompt's chunk and a decode row both pass the smallest power-of-two window (at least 64) that
holds what the slot has written, those positions not yet written masked out, and decode rows of
one window run in one call. A prompt's chunk passed the whole cache before: a 4-token prompt of
the benchmark model then wrote 16 presents of 1028 positions. Passing every row's whole
context made a step's cost grow with rows x context: on the benchmark model (context 1024), one
decode call of 8 rows took 132.5 ms against 33.3 ms for an 80-position past. Padding the past
to the longest companion instead changed logits by up to 5e-6 (one ulp in the softmax sum),
enough to flip a greedy choice one day; rows of different batch sizes at the same past length
came out bitwise equal on ONNX Runtime's CPU kernels, and ``tests/agent/generative`` checks
both. A prompt's chunk runs as a batch of one, so its shape depends on the sequence alone.

The cache is ``[slots, kv_heads, context, head_size]`` per layer and kind, zero-filled by the
allocator (pages untouched by any sequence cost no memory); a freed slot is not cleared, as the
mask hides what it holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.errors import LoadError
from runtimes.base import Runtime

GENAI_CONFIG = "genai_config.json"


@dataclass(frozen=True)
class DecoderShape:
    """What ``genai_config.json`` says of the decoder."""

    layers: int
    kv_heads: int
    head_size: int
    context: int
    vocab: int
    eos_token_id: int
    filename: str

    @classmethod
    def read(cls, version_dir: Path) -> DecoderShape:
        """Raises:
        LoadError: the file is missing or lacks a field, naming it."""
        path = version_dir / GENAI_CONFIG
        try:
            model = json.loads(path.read_text())["model"]
            decoder = model["decoder"]
            eos = model["eos_token_id"]
            return cls(
                layers=int(decoder["num_hidden_layers"]),
                kv_heads=int(decoder["num_key_value_heads"]),
                head_size=int(decoder["head_size"]),
                context=int(model["context_length"]),
                vocab=int(model["vocab_size"]),
                eos_token_id=int(eos[0] if isinstance(eos, list) else eos),
                filename=str(decoder["filename"]),
            )
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise LoadError(f"{path}: not a usable ONNX Runtime GenAI config ({exc!r})") from exc


MIN_WINDOW = 64
"""The shortest past a decode step passes (positions)."""


def past_window(position: int, context: int) -> int:
    """The past a decode row at ``position`` passes: the smallest power of two (at least
    :data:`MIN_WINDOW`) that holds every position written, at most the context. It depends on
    the row alone, so its attention reduces over the same length whatever its companions."""
    window = MIN_WINDOW
    while window < position:
        window *= 2
    return min(window, context)


@dataclass
class _Staged:
    """The past one decode call of ``window`` fed, kept for the next call of the same rows:
    ``[rows, kv_heads, window, head_size]`` per layer and kind, rows in ``slots`` order."""

    slots: tuple[int, ...]
    past: dict[str, np.ndarray]


class Decoder:
    """Runs prefill chunks and decode steps, keeping each slot's KV cache.

    A decode call's past is copied out of the cache once and then kept (:class:`_Staged`):
    the next call of the same rows at the same window feeds it again, with the token each row
    wrote added in place. Copying it every step cost more than the model on the benchmark
    model (8 rows: 5.5 ms at window 64 and 14.3 ms at 128, against a 13 ms step), most of it
    faulting in fresh pages. The copy is made again when the rows change (a sequence joins,
    leaves or moves to a longer window) or a prefill writes one of their slots; it holds
    what the per-step copy held, no more.
    """

    def __init__(self, runtime: Runtime, shape: DecoderShape, slots: int) -> None:
        self.runtime = runtime
        self.shape = shape
        self.slots = slots
        dims = (slots, shape.kv_heads, shape.context, shape.head_size)
        self._cache = {
            f"{layer}.{kind}": np.zeros(dims, dtype=np.float32)
            for layer in range(shape.layers)
            for kind in ("key", "value")
        }
        self._staged: dict[int, _Staged] = {}

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.shape.layers * self.shape.kv_heads * self.shape.head_size * 4

    def prefill(self, slot: int, tokens: list[int], start: int) -> np.ndarray:
        """Write the KV of ``tokens`` (positions ``start``...) into ``slot``; return the last
        token's logits ``[vocab]``."""
        logits: np.ndarray = self.prefill_rows([slot], [tokens], start)[0]
        return logits

    def prefill_rows(self, slots: list[int], tokens: list[list[int]], start: int) -> np.ndarray:
        """:meth:`prefill` of chunks of one shape (the same ``start`` and length) in one call:
        a row's shape is then still its own, so it computes what it computes alone. Returns
        each row's last logits ``[rows, vocab]``."""
        for kept, staged in list(self._staged.items()):
            if not set(slots).isdisjoint(staged.slots):  # a new prompt, or a next chunk
                del self._staged[kept]
        rows, q = len(slots), len(tokens[0])
        window = past_window(start, self.shape.context)
        mask = np.zeros((rows, window + q), dtype=np.int64)
        mask[:, :start] = 1
        mask[:, window:] = 1
        feed: dict[str, np.ndarray] = {
            "input_ids": np.array(tokens, dtype=np.int64),
            "position_ids": np.repeat(np.arange(start, start + q, dtype=np.int64)[None], rows, 0),
            "attention_mask": mask,
        }
        index = np.array(slots)
        for name, cache in self._cache.items():
            feed[f"past_key_values.{name}"] = cache[index, :, :window]
        out = self.runtime.infer(feed)
        for name, cache in self._cache.items():
            cache[index, :, start : start + q] = out[f"present.{name}"][:, :, window:]
        logits: np.ndarray = out["logits"][:, -1]
        return logits

    def decode(self, rows: list[tuple[int, int, int]]) -> np.ndarray:
        """One token for each ``(slot, token, position)``; the logits ``[rows, vocab]``, in
        the order of ``rows``. Rows run in one call per past window (:func:`past_window`):
        usually one, a few where sequences are far apart in length."""
        logits = np.empty((len(rows), self.shape.vocab), dtype=np.float32)
        groups: dict[int, list[int]] = {}
        for i, (_, _, position) in enumerate(rows):
            groups.setdefault(past_window(position, self.shape.context), []).append(i)
        for kept in [w for w in self._staged if w not in groups]:
            del self._staged[kept]  # no row runs at that window now
        for window, members in groups.items():
            logits[members] = self._decode_window([rows[i] for i in members], window)
        return logits

    def _decode_window(self, rows: list[tuple[int, int, int]], window: int) -> np.ndarray:
        order = sorted(range(len(rows)), key=lambda i: rows[i][0])  # rows in slot order
        slots = np.array([rows[i][0] for i in order])
        positions = np.array([rows[i][2] for i in order], dtype=np.int64)
        staged = self._staged.get(window)
        if staged is None or staged.slots != tuple(slots.tolist()):
            copied = {name: cache[slots, :, :window] for name, cache in self._cache.items()}
            staged = self._staged[window] = _Staged(tuple(slots.tolist()), copied)
        mask = (np.arange(window + 1)[None, :] < positions[:, None]).astype(np.int64)
        mask[:, window] = 1
        feed: dict[str, np.ndarray] = {
            "input_ids": np.array([[rows[i][1]] for i in order], dtype=np.int64),
            "position_ids": positions[:, None],
            "attention_mask": mask,
        }
        for name, past in staged.past.items():
            feed[f"past_key_values.{name}"] = past
        out = self.runtime.infer(feed)
        inside = positions < window  # a row at the window's end moves to the next one
        for name, cache in self._cache.items():
            written = out[f"present.{name}"][:, :, window]
            cache[slots, :, positions] = written
            staged.past[name][inside.nonzero()[0], :, positions[inside]] = written[inside]
        logits: np.ndarray = np.empty_like(out["logits"][:, -1])
        logits[order] = out["logits"][:, -1]
        return logits

    def close(self) -> None:
        self.runtime.close()
        self._cache.clear()
        self._staged.clear()
