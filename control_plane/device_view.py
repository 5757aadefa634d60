"""One device as text for the terminal (``edgefleet devices show``): presence, versions, labels,
the models it serves, a switch a rollout scheduled (or a cancel withdrew) and what its last
telemetry said."""

from __future__ import annotations

from typing import Any


def agent_line(d: dict[str, Any]) -> str:
    """The agent's version and, under a launcher, its release, crash loop and last trial:
    ``0.1.0, release 2.0.0`` or ``0.1.0, release base (3.0.0 rolled_back: not ready ...)``."""
    text = d["agent_version"] or "?"
    launcher = d.get("launcher")
    if not launcher:
        return text
    text += f", release {launcher['release']}"
    if launcher["phase"] == "degraded":
        text += f", degraded ({launcher['exits_in_a_row']} exits): {launcher['last_error']}"
    update = launcher.get("last_update")
    if update:
        why = f": {update['reason']}" if update.get("reason") else ""
        text += f" ({update['version']} {update['outcome']}{why})"
    return text


def capture_line(m: dict[str, Any]) -> str:
    """A served model's data capture: its policy and what it captured since the agent
    started, ``digits v1: on (sample_rate 1, ...); captured 3 (sampled 3), uploaded 3, ...``."""
    c = m["capture"]
    triggers = [f"sample_rate {c['sample_rate']:g}"]
    if c.get("low_confidence_below") is not None:
        triggers.append(f"low_confidence_below {c['low_confidence_below']:g}")
    if c.get("shadow_disagreement"):
        triggers.append("shadow_disagreement")
    policy = f"on ({', '.join(triggers)})" if c["enabled"] else "off"
    captured = c.get("captured") or {}
    by = ", ".join(f"{k} {v}" for k, v in sorted(captured.items()))
    dropped = c.get("dropped") or {}
    lost = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "none"
    return (
        f"{m['model']} v{m['version']}: {policy}; captured {sum(captured.values())}"
        f"{f' ({by})' if by else ''}, uploaded {c.get('uploaded', 0)}, spooled "
        f"{c.get('spooled', 0)} ({c.get('spooled_bytes', 0)} bytes), dropped {lost}"
    )


def device_lines(d: dict[str, Any]) -> list[str]:
    """``devices show``'s text: one fact a line."""
    labels = ",".join(f"{k}={v}" for k, v in sorted(d["labels"].items()))
    served = ", ".join(f"{m['model']} v{m['version']}" for m in d["models"])
    lines = [
        f"{d['id']}: {d['presence']}, last seen {d['last_seen'] or 'never'}",
        f"  profile        {d['hardware_profile'] or '?'}",
        f"  agent          {agent_line(d)}",
        f"  trust root     {d['trust_root_version'] or '?'}",
        f"  labels         {labels or 'none'}",
        f"  models         {served or 'none'}",
    ]
    for m in d["models"]:  # its data capture's policy and counts, where it has one
        if m.get("capture"):
            lines.append(f"  capture        {capture_line(m)}")
    for sw in d.get("switches", []):  # a switch scheduled for a window, or withdrawn
        if sw["state"] == "scheduled":
            words = f"scheduled at {sw['at']} (rollout {sw['rollout_id']})"
        else:
            words = f"withdrawn: rollout {sw['rollout_id']} cancelled, it never switches"
        lines.append(f"  switch         {sw['model']} v{sw['version']} {words}")
    t = d["last_telemetry"]
    if t is None:
        return [*lines, "  telemetry      none yet"]
    memory = t["memory_used_bytes"]
    load = [
        f"cpu {t['cpu_percent']:.0f}%" if t["cpu_percent"] is not None else "cpu ?",
        f"memory {memory / 2**20:.0f} MiB" if memory is not None else "memory ?",
    ]
    if t["temperature_c"] is not None:
        load.append(f"temperature {t['temperature_c']:.0f} C")
    return [
        *lines,
        f"  telemetry      seq {t['seq']} at {t['time']}, dropped {t['dropped']}",
        f"                 {', '.join(load)}",
    ]
