"""The benchmark's table and its goals, as Markdown."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from benchmarks.generative.bench import Results, summarise

LABELS = {
    "raw": "raw ORT loop (batch 1)",
    "genai": "onnxruntime-genai Engine (static batch)",
    "agent": "edgefleet agent (SSE)",
    "agent-1t": "edgefleet agent, 1 ORT thread (SSE)",
    "llamacpp": "llama.cpp server (SSE)",
}


def table(results: Results) -> tuple[str, dict[tuple[str, int], dict[str, float]]]:
    stats = {key: summarise(runs) for key, runs in results.runs.items()}
    base = stats.get(("raw", 1), stats.get(("agent", 1)))
    lines = [
        "| system | streams | tokens/s | x raw loop | TTFT p50 / p99 ms | inter-token p50 / p99 ms "
        "| peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (system, level), s in sorted(stats.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ratio = s["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        lines.append(
            f"| {LABELS[system]} | {level} | {s['tokens_per_s']:.0f} | {ratio:.2f} "
            f"| {s['ttft_p50_ms']:.1f} / {s['ttft_p99_ms']:.1f} "
            f"| {s['itl_p50_ms']:.1f} / {s['itl_p99_ms']:.1f} "
            f"| {results.rss_mib.get(system, float('nan')):.0f} |"
        )
    for name, pairs in results.ttft_pairs.items():
        alone = float(np.median([a for a, _ in pairs])) * 1e3
        loaded = float(np.median([b for _, b in pairs])) * 1e3
        lines.append(
            f"\nShort request TTFT, {LABELS[name]}: alone {alone:.1f} ms, "
            f"with 8 long streams {loaded:.1f} ms ({loaded / alone:.2f}x)"
        )
    return "\n".join(lines), stats


def _rate(stats: dict[tuple[str, int], dict[str, float]], system: str, level: int) -> float:
    return stats.get((system, level), {}).get("tokens_per_s", float("nan"))


def goals(results: Results, stats: dict[tuple[str, int], dict[str, float]]) -> str:
    """The issue's four goals, each with its figure and whether it is met."""
    rows: list[tuple[str, float, bool]] = []
    one, raw = _rate(stats, "agent", 1), _rate(stats, "raw", 1)
    rows.append(("one stream >= 0.9x the raw loop", one / raw, one / raw >= 0.9))
    eight = _rate(stats, "agent", 8)
    rows.append(("8 streams >= 3x one stream", eight / one, eight / one >= 3))
    for peer in ("genai", "llamacpp"):
        ratio = eight / _rate(stats, peer, 8)
        rows.append((f"8 streams ahead of {peer} (agent / {peer})", ratio, ratio > 1))
    if pairs := results.ttft_pairs.get("agent"):
        ratio = float(np.median([b / a for a, b in pairs]))
        rows.append(("short TTFT under 8 long streams <= 2x alone", ratio, ratio <= 2))
    out = ["| goal | figure | met |", "|---|---:|---|"]
    out += [f"| {g} | {f:.2f}x | {'yes' if ok else 'no'} |" for g, f, ok in rows]
    return "\n".join(out)


def host() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, load average {load} (1, 5, 15 min) at the end of the run"


def markdown(results: Results) -> str:
    text, stats = table(results)
    return f"{text}\n\n{goals(results, stats)}\n\n{host()}\n"


def as_json(results: Results) -> dict[str, Any]:
    return {
        "stats": {f"{s}@{n}": v for (s, n), v in table(results)[1].items()},
        "rss_mib": results.rss_mib,
        "ttft_pairs_s": results.ttft_pairs,
    }
