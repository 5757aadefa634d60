"""The benchmark goals (docs/benchmarks.md, issue "Benchmarks side by side"), checked against a
run's results. Each is a ratio of figures from the same run, except the fleet's time limit and
the start-up limit, which are absolute by their nature."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Goal:
    name: str
    target: str
    measured: str
    met: bool


def _runs(serving: dict[str, Any], model: str, system: str, body: str, conc: int) -> list[Any]:
    for m in serving["models"]:
        for c in m["cells"]:
            if m["model"] == model and (c["system"], c["body"], c["concurrency"]) == (
                system,
                body,
                conc,
            ):
                return list(c["runs"])
    return []


def _rates(serving: dict[str, Any], model: str, system: str, body: str, conc: int) -> list[float]:
    """A cell's throughput in each repetition, in the order of the repetitions."""
    return [float(r["requests_per_s"]) for r in _runs(serving, model, system, body, conc)]


def _ratio_goal(
    name: str, target: float, a: list[float], b: list[float], what: str, note: str = ""
) -> Goal:
    """``a`` over ``b``, measured side by side in each repetition: the figure is the median of
    the ratios within repetitions. The systems of a repetition are measured seconds apart, and
    the machine's speed moves between repetitions (the run of 2026-12-04: 4.05, 2.73 and 4.04
    within repetitions, where the ratio of the medians, which took the two medians from
    different repetitions, was 2.87); that ratio is shown beside it."""
    if not a or len(a) != len(b) or not all(b):
        return Goal(name, f">= {target:g} x", "not measured", False)
    paired = statistics.median(x / y for x, y in zip(a, b, strict=True))
    within = ", ".join(f"{x / y:.2f}" for x, y in zip(a, b, strict=True))
    ma, mb = statistics.median(a), statistics.median(b)
    measured = (
        f"{paired:.2f} x (within repetitions {within}; medians {ma:.0f} vs {mb:.0f} {what}, "
        f"{ma / mb:.2f} x{note})"
    )
    return Goal(name, f">= {target:g} x", measured, paired >= target)


def _to_raw(serving: dict[str, Any], system: str) -> Goal:
    """``system`` at cnn, binary, c=8 against raw ONNX Runtime at its best."""
    raw: list[float] = []
    for m in serving["models"]:
        if m["model"] == "cnn":
            raw = [float(r) for r in m["raw"]["runs_rows_per_s"]]  # one per repetition, first
    name = f"cnn, binary V2, c=8: {system} / raw ONNX Runtime best in-process"
    served = _rates(serving, "cnn", system, "binary", 8)
    around = [r.get("raw_around_rows_per_s") for r in _runs(serving, "cnn", system, "binary", 8)]
    if served and all(around):
        # raw measured right before and right after each run of the cell (suite.RAW_BRACKETED)
        first = _ratio_goal(name, 0.9, served, raw, "rows/s")
        start = first.measured.split(" (", 1)[0]
        note = f"; raw measured right before and after each; at each repetition's start: {start}"
        bracket = [statistics.mean(pair) for pair in around if pair]
        return _ratio_goal(name, 0.9, served, bracket, "rows/s", note)
    return _ratio_goal(name, 0.9, served, raw, "rows/s")


def lean_reference(serving: dict[str, Any]) -> str | None:
    """The leanest Python server (:mod:`benchmarks.serving.lean_server`) and the agent without
    batching in the cnn goal's cell, as the goal measures the agent: not goals, the scale."""
    found = [
        f"{what} served {_to_raw(serving, system).measured}"
        for system, what in (
            ("agent-nobatch", "the agent without batching (`agent-nobatch`, two instances)"),
            (
                "lean",
                "the leanest Python server of the V2 infer route (`lean`: no batching, "
                "validation, limits or metrics)",
            ),
        )
        if _runs(serving, "cnn", system, "binary", 8)
    ]
    if not found:
        return None
    return "For scale, in the same cell and measured the same way, " + "; ".join(found) + "."


def serving_goals(serving: dict[str, Any]) -> list[Goal]:
    goals = [_to_raw(serving, "agent")]
    agent_mlp = _rates(serving, "mlp", "agent", "json", 32)
    goals.append(
        _ratio_goal(
            "mlp, JSON V2, c=32: agent / plain FastAPI",
            2,
            agent_mlp,
            _rates(serving, "mlp", "fastapi", "json", 32),
            "req/s",
        )
    )
    goals.append(
        _ratio_goal(
            "mlp, JSON V2, c=32: agent / MLServer",
            3,
            agent_mlp,
            _rates(serving, "mlp", "mlserver", "json", 32),
            "req/s",
        )
    )
    for model in ("mlp", "cnn"):
        for body in ("json", "binary"):
            runs = _runs(serving, model, "agent", body, 32)
            if not runs:
                continue
            p50 = statistics.median(r["p50_ms"] for r in runs)
            p99 = statistics.median(r["p99_ms"] for r in runs)
            goals.append(
                Goal(
                    f"{model}, {body} V2, c=32: agent p99 / p50",
                    "<= 3 x",
                    f"{p99 / p50:.2f} x ({p99:.1f} / {p50:.1f} ms)",
                    p99 <= 3 * p50,
                )
            )
    for m in serving["models"]:
        over = m.get("overload")
        if not over:
            continue
        shed = int(over["statuses"].get("503", 0))
        bounded = over["max_rss_mb"] <= 1.5 * over["idle_rss_mb"]
        goals.append(
            Goal(
                f"{m['model']}, c={over['concurrency']} for {over['duration_s']:g} s: "
                "RSS bounded, excess shed with 503",
                "peak RSS <= 1.5 x idle, 503s, no connection errors",
                f"RSS {over['idle_rss_mb']:.0f} -> {over['max_rss_mb']:.0f} MB, "
                f"{shed} x 503, {over['errors']} errors",
                bounded and shed > 0 and over["errors"] == 0,
            )
        )
    return goals


def footprint_goals(footprint: dict[str, Any]) -> list[Goal]:
    s = footprint["summary"]
    goals = []
    if "agent-cold" in s and "fastapi" in s:
        a, f = s["agent-cold"]["idle_rss_mb"], s["fastapi"]["idle_rss_mb"]
        goals.append(
            Goal(
                "idle RSS with mlp: agent / plain FastAPI",
                "<= 1.2 x",
                f"{a / f:.2f} x ({a:.0f} vs {f:.0f} MB)",
                a <= 1.2 * f,
            )
        )
    for name in ("agent-cold", "agent-warm"):
        if name in s:
            t = s[name]["start_to_first_inference_s"]
            goals.append(
                Goal(f"{name}: process start to first inference", "< 2 s", f"{t:.2f} s", t < 2)
            )
    return goals


def fleet_goals(fleet: dict[str, Any]) -> list[Goal]:
    goals = []
    for size in fleet.get("sizes", []):
        if size["devices"] != 5000:  # the goals are stated for 5,000
            continue
        s = size.get("summary") or {}
        t = s.get("rollout_99pct_committed_s")
        goals.append(
            Goal(
                f"{size['devices']:,} devices: single-wave rollout to 99 % committed",
                "<= 60 s",
                "-" if t is None else f"{t:.1f} s",
                t is not None and t <= 60,
            )
        )
        ratio = (size.get("ingest") or {}).get("ratio_to_bare")
        goals.append(
            Goal(
                f"{size['devices']:,} devices: lossless ingest / bare subscriber",
                ">= 0.5 x",
                "-" if ratio is None else f"{ratio:.2f} x",
                ratio is not None and ratio >= 0.5,
            )
        )
    return goals


def evaluate(
    serving: dict[str, Any] | None, footprint: dict[str, Any] | None, fleet: dict[str, Any] | None
) -> list[Goal]:
    return (
        (serving_goals(serving) if serving else [])
        + (footprint_goals(footprint) if footprint else [])
        + (fleet_goals(fleet) if fleet else [])
    )
