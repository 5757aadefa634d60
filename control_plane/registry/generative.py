"""Validation of a generative variant (a ``genai`` folder): its config names files it holds,
its tokenizer reads, and greedy decoding of the reference prompts gives the same tokens on
every runtime here that can run the folder (:mod:`runtimes.generative_check`), and the
folder's expected outputs where it brings them. Each fault is a failed check naming the
reason, so the version cannot be rolled out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from runtimes.errors import ModelFileError
from runtimes.generative_check import (
    GenaiFolder,
    genai_installed,
    greedy_genai,
    greedy_onnxruntime,
    reference_prompts,
)

Check = Callable[[str, bool, str], None]


def validate_generative(directory: Path, label: str, check: Check) -> bool:
    """Record the checks of the folder in ``directory``; whether it ran on any runtime."""
    try:
        folder = GenaiFolder.read(directory)
        prompts, max_tokens, expected = reference_prompts(directory)
        encoded = folder.encode(prompts)
    except ModelFileError as exc:
        check(f"{label} is a readable generative folder", False, str(exc))
        return False
    check(f"{label} is a readable generative folder", True, f"decoder {folder.decoder_file.name}")
    runs = [("onnxruntime", greedy_onnxruntime)]
    if genai_installed():
        runs.append(("onnxruntime-genai", greedy_genai))
    results: list[tuple[str, list[list[int]]]] = []
    for name, decode in runs:
        try:
            tokens = decode(folder, encoded, max_tokens)
        except ModelFileError as exc:
            check(f"{label} decodes on {name}", False, str(exc))
            continue
        check(
            f"{label} decodes on {name}",
            True,
            f"{len(prompts)} reference prompts, {sum(map(len, tokens))} tokens greedy",
        )
        results.append((name, tokens))
    if expected is not None and results:
        name, tokens = results[0]
        check(
            f"{label} on {name} gives the folder's reference outputs",
            tokens == expected,
            _difference(tokens, expected),
        )
    for name, tokens in results[1:]:
        ref_name, ref = results[0]
        check(f"{label} on {name} agrees with {ref_name}", tokens == ref, _difference(tokens, ref))
    return bool(results)


def _difference(got: list[list[int]], want: list[list[int]]) -> str:
    """Where two sets of greedy completions first part, or that they agree."""
    if len(got) != len(want):
        return f"{len(got)} completions against {len(want)}"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            at = min(len(a), len(b)) if at is None else at
            return f"prompt {i}: token {at} differs ({a[at : at + 3]} against {b[at : at + 3]})"
    return f"token for token over {sum(map(len, got))} tokens"
