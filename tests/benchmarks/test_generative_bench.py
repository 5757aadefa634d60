"""The generative benchmark's harness, for a few seconds on the tiny LM: every system it can
run here streams, is timed and lands in the table; the GGUF export loads in llama.cpp."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from benchmarks.generative.bench import Plan, run
from benchmarks.generative.report import goals, markdown, table
from runtimes.examples.tiny_lm import LmSize

pytest.importorskip("tokenizers")


def _available() -> tuple[str, ...]:
    systems = ["raw", "agent"]
    if importlib.util.find_spec("onnxruntime_genai"):
        systems.append("genai")
    if importlib.util.find_spec("xllamacpp") and importlib.util.find_spec("gguf"):
        systems.append("llamacpp")
    return tuple(systems)


def test_harness_runs_every_available_system_on_the_tiny_lm(tmp_path: Path) -> None:
    systems = _available()
    plan = Plan(
        size=LmSize.TINY, levels=(1, 2), max_tokens=4, long_tokens=8, repeats=1, systems=systems
    )
    results = run(plan, tmp_path)
    text, stats = table(results)
    for system in systems:
        assert stats[(system, 1)]["tokens_per_s"] > 0
        assert results.rss_mib[system] > 0
        if system != "raw":
            assert (system, 2) in stats
    for system in ("agent", "llamacpp"):
        if system in systems:
            ((alone, loaded),) = results.ttft_pairs[system]
            assert 0 < alone and 0 < loaded
    # every stream got the tokens it asked for
    for runs in results.runs.values():
        assert all(r["tokens"] == 4 for records in runs for r in records)
    assert "one stream >= 0.9x the raw loop" in goals(results, stats)
    assert "| edgefleet agent (SSE) | 1 |" in markdown(results)
