"""The run's full tables (``benchmarks/runs.md``): every serving cell, the footprint, the fleet.

The page (``docs/benchmarks.md``) gives the goals and the method; these are the figures behind
them, medians of the run's repetitions.
"""

from __future__ import annotations

import statistics
from typing import Any


def num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


LATENCY_HEADER = [
    "system",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "CPU ms/inf",
    "mean batch",
    "server cores",
    "client cores",
    "non-200",
]


def serving_section(serving: dict[str, Any]) -> list[str]:
    out = ["## Serving", ""]
    for m in serving["models"]:
        raw = m["raw"]
        out += [
            f"### `{m['model']}`",
            "",
            f"Raw ONNX Runtime in-process, best batch size {raw['best_batch']}"
            f"{_sessions(raw.get('best_instances', 1))}: "
            f"**{statistics.median(raw['runs_rows_per_s']):.0f} rows/s** "
            f"(median of {len(raw['runs_rows_per_s'])}).",
            "",
        ]
        out += _tuning(m)
        systems = sorted({(c["system"], c["body"]) for c in m["cells"]})
        concs = sorted({c["concurrency"] for c in m["cells"]})
        rows = []
        for system, body in systems:
            line = [f"{system} ({body})"]
            for conc in concs:
                cell = _cell(m, system, body, conc)
                line.append(num(_median(cell, "requests_per_s"), 0) if cell else "-")
            rows.append(line)
        out += ["Throughput (successful requests/s) by concurrency:", ""]
        out += md_table(["system", *[f"c={c}" for c in concs]], rows)
        for conc in concs:
            rows = []
            for system, body in systems:
                cell = _cell(m, system, body, conc)
                if cell is not None:
                    rows.append([f"{system} ({body})", *_latency_row(cell)])
            out += ["", f"Concurrency {conc}:", "", *md_table(LATENCY_HEADER, rows)]
        over = m.get("overload")
        if over:
            out += [
                "",
                f"Overload, concurrency {over['concurrency']} for {over['duration_s']:g} s "
                f"(binary): statuses {over['statuses']}, connection errors {over['errors']}; "
                f"RSS idle {over['idle_rss_mb']:.0f} MB, peak {over['max_rss_mb']:.0f} MB; "
                f"afterwards at concurrency 1: {over['after_statuses']}, "
                f"p50 {over['after_p50_ms']:.1f} ms.",
            ]
        out.append("")
    return out


def _tuning(m: dict[str, Any]) -> list[str]:
    """What ``[batching] tune`` measured at load in each agent, and what it chose."""
    out = []
    for name, params in m.get("agent_parameters", {}).items():
        tuning = params.get("batch_tuning")
        if tuning:
            rates = ", ".join(f"{r:,.0f} at {b}" for b, r in tuning["rows_per_s"].items())
            chose = (
                "no batching"
                if tuning["max_batch_size"] == 1
                else f"batches of up to {tuning['max_batch_size']} rows"
            )
            out += [
                f"`{name}` measured at load (`[batching] tune`, {tuning['elapsed_s']:.2f} s)"
                f" rows/s of {rates} rows, and served with {chose}.",
                "",
            ]
    return out


def _latency_row(cell: dict[str, Any]) -> list[str]:
    return (
        [num(_median(cell, k), 1) for k in ("p50_ms", "p95_ms", "p99_ms")]
        + [num(_median(cell, "server_cpu_ms_per_inference"), 2)]
        + [num(_median(cell, "mean_batch_rows"), 1)]
        + [num(_median(cell, k), 2) for k in ("server_cpu_cores", "client_cpu_cores")]
        + [_errors(cell)]
    )


def _sessions(instances: int) -> str:
    return "" if instances == 1 else f", {instances} sessions side by side"


def _cell(m: dict[str, Any], system: str, body: str, conc: int) -> dict[str, Any] | None:
    for c in m["cells"]:
        if (c["system"], c["body"], c["concurrency"]) == (system, body, conc):
            return dict(c)
    return None


def _median(cell: dict[str, Any], key: str) -> float | None:
    values = [r[key] for r in cell["runs"] if r.get(key) is not None]
    return statistics.median(values) if values else None


def _errors(cell: dict[str, Any]) -> str:
    bad = sum(n for r in cell["runs"] for s, n in r["statuses"].items() if s != "200")
    bad += sum(r["errors"] for r in cell["runs"])
    return str(bad)


def footprint_section(footprint: dict[str, Any]) -> list[str]:
    rows = [
        [
            name,
            num(v["idle_rss_mb"], 0),
            num(v["start_to_first_inference_s"], 2),
            str(int(v["processes"])),
        ]
        for name, v in footprint["summary"].items()
    ]
    return [
        "## Footprint",
        "",
        f"`mlp` loaded, medians of {footprint['repeat']} starts.",
        "",
        *md_table(["system", "idle RSS MB", "start to first inference s", "processes"], rows),
        "",
    ]


def _phase_usage(size: dict[str, Any], phase: str) -> tuple[str, str]:
    usage = size.get(phase) or {}
    cp = usage.get("control_plane", usage)
    return num(cp.get("cpu_cores"), 2), num(cp.get("rss_mib") or cp.get("rss_mb"), 0)


FLEET_HEADER = [
    "devices",
    "rollout to 99 % committed s",
    "rollback to 99 % s",
    "ingest lossless msg/s",
    "bare subscriber msg/s",
    "bare before / after the sweep",
    "ratio",
    "CP cores (idle)",
    "CP RSS MB (idle)",
]


def fleet_section(fleet: dict[str, Any]) -> list[str]:
    rows = []
    for size in fleet.get("sizes", []):
        n = f"{size['devices']:,}"
        if "stopped" in size:
            rows.append([n, f"stopped: {size['stopped']}", *["-"] * 7])
            continue
        s, ingest = size.get("summary", {}), size.get("ingest") or {}
        sweep = ingest.get("sweep") or {}
        cpu, rss = _phase_usage(size, "idle")
        drift = " / ".join(
            num(ingest.get(key), 0) for key in ("bare_before_per_s", "bare_after_per_s")
        )
        rows.append(
            [
                n,
                num(s.get("rollout_99pct_committed_s"), 1),
                num(s.get("rollback_99pct_reverted_s"), 1),
                num(sweep.get("max_lossless_per_s"), 0),
                num(ingest.get("bare_delivered_per_s"), 0),
                drift,
                num(ingest.get("ratio_to_bare"), 2),
                cpu,
                rss,
            ]
        )
    settings = fleet.get("settings", {})
    return [
        "## Fleet scale",
        "",
        f"Simulator client: {settings.get('simulator_client', '-')}. "
        f"Command: `{fleet.get('command', '-')}`.",
        "",
        *md_table(FLEET_HEADER, rows),
        "",
    ]
