"""A rollout's status as text for the terminal (``edgefleet rollouts status [--watch]``): its
waves, each device's phase as the device reports it, the bake's countdown and each gate's
verdict in words, "not judged" included."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from control_plane.db.states import RolloutState


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def phase_words(device: dict[str, Any]) -> str:
    """What a device is doing: its phase if it reported one, else its row's state."""
    phase = device.get("phase")
    state = device["state"]
    if phase is None or state not in ("sent", "reverting"):
        words = state.replace("_", " ")
        reason = device.get("reason")
        return f"{words} ({reason})" if reason and state not in ("committed", "pending") else words
    what = phase["state"]
    if what == "downloading" and phase.get("bytes_total"):
        done, total = phase.get("bytes_done") or 0, phase["bytes_total"]
        words = f"downloading {done / total:.0%} ({_mb(done)} of {_mb(total)})"
    elif what == "active" and phase.get("window_s") is not None:
        words = (
            f"health window, {phase.get('window_left_s', 0):.0f} s of {phase['window_s']:g} left"
        )
    else:
        words = what.replace("_", " ")
    return f"{words} ({phase['reason']})" if phase.get("reason") else words


def gate_words(doc: dict[str, Any]) -> str | None:
    """The current wave's gate verdict, or None before the wave was judged."""
    report = doc["gate_report"].get(str(doc["current_wave"]))
    if not report:
        return None
    gates = doc["gates"]
    if report.get("note"):
        waiting = ": waiting for traffic" if report.get("waiting_for_traffic") else ""
        return (
            f"gates not judged: {report['requests']} requests < minimum "
            f"{gates['min_requests']}{waiting}"
        )
    parts = [
        f"error rate {report['error_rate']:.1%} (limit {gates['max_error_rate']:.1%}) "
        f"over {report['requests']} requests"
    ]
    if report.get("p99_ratio") is not None:
        parts.append(f"p99 {report['p99_ratio']:.2f}x (limit {gates['max_p99_ratio']:g}x)")
    if (drift := report.get("drift")) and drift.get("psi") is not None:
        parts.append(
            f"input drift PSI {drift['psi']:.3f} on {drift['feature']} at {drift['device_id']} "
            f"(limit {drift['max_drift']:g})"
        )
    if accuracy := report.get("accuracy"):
        parts.append(accuracy_words(accuracy))
    return "gates: " + ", ".join(parts)


def accuracy_words(report: dict[str, Any]) -> str:
    """The ``max_accuracy_drop`` gate's report (:mod:`control_plane.rollouts.accuracy_gate`)."""
    new, base = report.get("new"), report.get("baseline")
    if not report["judged"] or new is None or base is None:
        return f"live accuracy not judged ({report.get('note', '')})"
    if "accuracy" in new:
        return (
            f"live accuracy {new['accuracy']:.3f} vs v{report['baseline_version']}'s "
            f"{base['accuracy']:.3f} (max drop {report['max_accuracy_drop']:g}) over "
            f"{new['outcomes']} and {base['outcomes']} outcomes"
        )
    return (
        f"live mean absolute error {new['mean_abs_error']:.4g} vs "
        f"v{report['baseline_version']}'s {base['mean_abs_error']:.4g}"
    )


def shadow_words(state: dict[str, Any], spec: dict[str, Any]) -> str:
    """A wave's shadow phase (:mod:`control_plane.rollouts.shadow`) in words."""
    words = f"shadow {state['state']}" + (", withdrawn" if state.get("withdrawn") else "")
    if state.get("agreement") is not None:
        words += (
            f": agreement {state['agreement']:.1%} (min {spec['min_agreement']:.1%}) over "
            f"{state['rows']} rows, {state['requests']} requests"
            f" (min {spec['min_requests']}), {state['dropped']} dropped"
        )
        if state.get("max_abs_diff") is not None:
            words += f", max abs diff {state['max_abs_diff']:.3g}"
        if state.get("latency_ratio") is not None:
            words += f", candidate latency {state['latency_ratio']:.2f}x"
    else:
        words += f": {state.get('requests', 0)} shadowed requests (min {spec['min_requests']})"
    return words


def subject_words(doc: dict[str, Any]) -> str:
    """What a rollout ships: ``model vN``, or ``agent release X``."""
    if doc.get("agent_version"):
        return f"agent release {doc['agent_version']}"
    return f"{doc['model']} v{doc['version']}"


def status_lines(doc: dict[str, Any], now: datetime | None = None) -> list[str]:
    now = now or datetime.now(UTC)
    head = f"rollout {doc['id']}: {subject_words(doc)} {doc['state']}"
    lines = [head + (f" ({doc['reason']})" if doc["reason"] else "")]
    if doc.get("cancelled"):
        lines.append(f"  {doc['cancelled']['summary']}")
    running = doc["state"] == RolloutState.RUNNING
    for w in doc["waves"]:
        current = running and w["wave"] == doc["current_wave"]
        states = " ".join(f"{s}={n}" for s, n in sorted(w["states"].items()))
        lines.append(
            f" {'>' if current else ' '} wave {w['wave']} ({w['size']}): "
            f"{w['devices']} devices  {states}"
        )
        shadow = (doc.get("shadow") or {}).get("waves", {}).get(str(w["wave"]))
        if shadow:
            lines.append(f"     {shadow_words(shadow, doc['shadow']['spec'])}")
        if current and doc.get("bake_started_at"):
            started = datetime.fromisoformat(doc["bake_started_at"])
            left = doc["bake_time_s"] - (now - started).total_seconds()
            lines.append(f"     baking, {max(0.0, left):.0f} s of {doc['bake_time_s']:g} left")
        if current and (verdict := gate_words(doc)):
            lines.append(f"     {verdict}")
        for d in doc.get("devices", []):
            if d["wave"] == w["wave"] and (current or d["state"] not in ("pending", "committed")):
                lines.append(f"       {d['device_id']}: {phase_words(d)}")
    return lines
