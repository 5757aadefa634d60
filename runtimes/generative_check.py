"""Checks of a generative model folder (an ONNX Runtime GenAI folder) before the fleet may roll
it out: its config names files it holds, its tokenizer reads, and greedy decoding of reference
prompts runs on every runtime here that can run it, with the same tokens on each.

Two runtimes read such a folder: a plain greedy loop over ONNX Runtime's session (the graph
the agent's token loop runs, one sequence at a time, its KV cache passed back as the
``past_key_values`` inputs) and, where installed, ``onnxruntime-genai``'s own generator.
Greedy decoding is deterministic, so they must agree token for token; a model whose logits
have the wrong shape, or whose cache does not round-trip, fails here with the reason rather
than on a device. Blocking: the control plane runs it in a thread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runtimes.errors import ModelFileError
from runtimes.formats import GENAI_CONFIG

TOKENIZER_FILE = "tokenizer.json"
REFERENCE_PROMPTS = ("The fleet", "hello, edge", "Once upon a time there was")
"""Prompts decoded by every runtime when the folder brings none (``reference_prompts.json``)."""
REFERENCE_PROMPTS_FILE = "reference_prompts.json"
"""Optional in a folder: ``{"prompts": [...], "max_tokens": N, "outputs": [[ids], ...]}``; the
outputs, when given, are what greedy decoding must produce."""
REFERENCE_TOKENS = 12


@dataclass(frozen=True)
class GenaiFolder:
    """What a folder's ``genai_config.json`` says, checked against the files it holds."""

    directory: Path
    decoder_file: Path
    layers: int
    kv_heads: int
    head_size: int
    vocab: int
    context: int
    eos_ids: frozenset[int]

    @classmethod
    def read(cls, directory: Path) -> GenaiFolder:
        """Raises:
        ModelFileError: the config is missing, unreadable, lacks a field, or names a decoder
            file the folder does not hold (each naming the reason)."""
        path = directory / GENAI_CONFIG
        try:
            model = json.loads(path.read_text())["model"]
            decoder = model["decoder"]
            eos = model["eos_token_id"]
            folder = cls(
                directory=directory,
                decoder_file=directory / str(decoder["filename"]),
                layers=int(decoder["num_hidden_layers"]),
                kv_heads=int(decoder["num_key_value_heads"]),
                head_size=int(decoder["head_size"]),
                vocab=int(model["vocab_size"]),
                context=int(model["context_length"]),
                eos_ids=frozenset(int(e) for e in (eos if isinstance(eos, list) else [eos])),
            )
        except OSError as exc:
            raise ModelFileError(f"{GENAI_CONFIG} cannot be read: {exc.strerror}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelFileError(f"{GENAI_CONFIG} is not a usable config ({exc!r})") from exc
        if not folder.decoder_file.is_file():
            raise ModelFileError(
                f"{GENAI_CONFIG} names the decoder file {folder.decoder_file.name!r}, "
                "which the folder does not hold"
            )
        return folder

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        """Raises ModelFileError: ``tokenizer.json`` is missing or does not read."""
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(self.directory / TOKENIZER_FILE))
        except Exception as exc:  # tokenizers raises a bare Exception for a bad file
            raise ModelFileError(f"{TOKENIZER_FILE} does not read: {exc}") from exc
        return [tokenizer.encode(p).ids for p in prompts]


def greedy_onnxruntime(
    folder: GenaiFolder, prompts: list[list[int]], max_tokens: int
) -> list[list[int]]:
    """Greedy completions of ``prompts`` (token ids) by a plain loop over ONNX Runtime's CPU
    session, one sequence at a time.

    Raises:
        ModelFileError: the decoder does not load, or its outputs have the wrong shape.
    """
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(folder.decoder_file), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own exception types vary by version
        raise ModelFileError(f"the decoder does not load in onnxruntime: {exc}") from exc
    return [_greedy_one(session, folder, ids, max_tokens) for ids in prompts]


def _greedy_one(
    session: object, folder: GenaiFolder, prompt: list[int], max_tokens: int
) -> list[int]:
    empty = np.zeros((1, folder.kv_heads, 0, folder.head_size), dtype=np.float32)
    past = {
        f"past_key_values.{i}.{kind}": empty
        for i in range(folder.layers)
        for kind in ("key", "value")
    }
    names = ["logits"] + [
        f"present.{i}.{k}" for i in range(folder.layers) for k in ("key", "value")
    ]
    step, done, out = list(prompt), 0, list[int]()
    while len(out) < max_tokens:
        feed = {
            "input_ids": np.array([step], dtype=np.int64),
            "attention_mask": np.ones((1, done + len(step)), dtype=np.int64),
            "position_ids": np.arange(done, done + len(step), dtype=np.int64)[None],
            **past,
        }
        try:
            logits, *presents = session.run(names, feed)  # type: ignore[attr-defined]
        except Exception as exc:
            raise ModelFileError(f"the decoder does not run in onnxruntime: {exc}") from exc
        if logits.shape != (1, len(step), folder.vocab):
            raise ModelFileError(
                f"logits have shape {list(logits.shape)}, expected [1, {len(step)}, "
                f"{folder.vocab}] (batch, positions, vocab_size of {GENAI_CONFIG})"
            )
        done += len(step)
        past = dict(zip(past, presents, strict=True))
        token = int(logits[0, -1].argmax())
        out.append(token)
        if token in folder.eos_ids:
            break
        step = [token]
    return out


def greedy_genai(folder: GenaiFolder, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy completions of ``prompts`` by ``onnxruntime-genai``'s generator on the folder.

    Raises:
        ModelFileError: the folder does not load or run there.
    """
    import onnxruntime_genai as og

    try:
        model = og.Model(str(folder.directory))
        outs = []
        for ids in prompts:
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=len(ids) + max_tokens, do_sample=False)
            generator = og.Generator(model, params)
            generator.append_tokens(ids)
            while not generator.is_done():
                generator.generate_next_token()
            outs.append([int(t) for t in generator.get_sequence(0)[len(ids) :]])
            del generator
    except Exception as exc:  # og raises RuntimeError with the native message
        raise ModelFileError(f"the folder does not run in onnxruntime-genai: {exc}") from exc
    return outs


def genai_installed() -> bool:
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return False
    return True


def reference_prompts(directory: Path) -> tuple[list[str], int, list[list[int]] | None]:
    """The folder's reference prompts, token budget and expected outputs, else the defaults.

    Raises:
        ModelFileError: ``reference_prompts.json`` is there but not usable.
    """
    path = directory / REFERENCE_PROMPTS_FILE
    if not path.is_file():
        return list(REFERENCE_PROMPTS), REFERENCE_TOKENS, None
    try:
        doc = json.loads(path.read_text())
        prompts = [str(p) for p in doc["prompts"]]
        outputs = doc.get("outputs")
        expected = [[int(t) for t in o] for o in outputs] if outputs is not None else None
        return prompts, int(doc.get("max_tokens", REFERENCE_TOKENS)), expected
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(f"{REFERENCE_PROMPTS_FILE} is not usable ({exc!r})") from exc
