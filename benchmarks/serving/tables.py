"""Markdown pieces of the benchmark report."""

from __future__ import annotations

from typing import Any


def num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _phase_usage(size: dict[str, Any], phase: str) -> tuple[str, str]:
    usage = size.get(phase) or {}
    cp = usage.get("control_plane", usage)
    return num(cp.get("cpu_cores"), 2), num(cp.get("rss_mib") or cp.get("rss_mb"), 0)


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
    header = [
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
    settings = fleet.get("settings", {})
    return [
        "## Fleet scale",
        "",
        "Simulated devices speak the real protocol (birth, telemetry, signed manifests verified "
        "against the trust root, update states through committed, rollback commands) against a "
        "real Mosquitto and the real control plane (SQLite). The bare subscriber's rate is "
        "measured before the ingest sweep and again after it; the ratio is to the median of "
        "both sets. "
        f"Simulator client: {settings.get('simulator_client', '-')}. "
        f"Command: `{fleet.get('command', '-')}`.",
        "",
        *md_table(header, rows),
        "",
    ]
