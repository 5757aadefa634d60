"""PNG plots of the serving results (matplotlib, no display)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _median(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def serving_plots(m: dict[str, Any], images: Path) -> list[str]:
    model = m["model"]
    series: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for c in m["cells"]:
        series.setdefault(f"{c['system']} ({c['body']})", {})[c["concurrency"]] = c["runs"]
    names = []

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, by_conc in sorted(series.items()):
        concs = sorted(by_conc)
        ax.plot(
            concs, [_median(by_conc[c], "requests_per_s") for c in concs], marker="o", label=label
        )
    raw = statistics.median(m["raw"]["runs_rows_per_s"])
    ax.axhline(raw, color="grey", linestyle="--", label=raw_label(m["raw"]))
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="concurrency",
        ylabel="requests/s (log)",
        title=f"{model}: throughput",
    )
    ax.legend(fontsize=7)
    names.append(_save(fig, images / f"throughput-{model}.png"))

    conc = 32 if any(32 in v for v in series.values()) else max(max(v) for v in series.values())
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = sorted(k for k, v in series.items() if conc in v)
    width = 0.27
    for i, key in enumerate(("p50_ms", "p95_ms", "p99_ms")):
        xs = [j + (i - 1) * width for j in range(len(labels))]
        ax.bar(xs, [_median(series[label][conc], key) for label in labels], width, label=key[:3])
    ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=7)
    ax.set(ylabel="ms", yscale="log", title=f"{model}: latency at concurrency {conc}")
    ax.legend()
    names.append(_save(fig, images / f"latency-{model}.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for c in sorted(m["cells"], key=lambda c: c["concurrency"]):
        if c["system"] != "agent" or c["body"] != "binary":
            continue
        hist = _per_bucket(c["runs"][-1].get("batch_histogram") or {})
        if hist:
            ax.plot(list(hist), list(hist.values()), marker="o", label=f"c={c['concurrency']}")
    ax.set(
        xlabel="rows per batch (bucket upper bound)",
        ylabel="share of batches",
        title=f"{model}: agent batch sizes (binary)",
    )
    ax.legend()
    names.append(_save(fig, images / f"batches-{model}.png"))
    return names


def raw_label(raw: dict[str, Any]) -> str:
    """The raw line's legend: its best shape, sessions side by side and batch size."""
    sessions = raw.get("best_instances", 1)
    shape = f"{sessions} sessions x batch" if sessions > 1 else "batch"
    return f"raw ONNX Runtime, {shape} {raw['best_batch']}"


def _per_bucket(cumulative: dict[str, float]) -> dict[str, float]:
    """Prometheus cumulative ``le`` buckets as the share of batches in each bucket."""
    items = sorted(((float(k), v) for k, v in cumulative.items() if k != "+Inf"))
    total = cumulative.get("+Inf") or (items[-1][1] if items else 0)
    out, prev = {}, 0.0
    for bound, count in items:
        if total:
            out[f"{bound:g}"] = (count - prev) / total
        prev = count
    return out


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name
