"""One device as text for the terminal (``edgefleet devices show``): presence, versions, labels,
the models it serves, a switch a rollout scheduled (or a cancel withdrew) and what its last
telemetry said."""

from __future__ import annotations

from typing import Any


def device_lines(d: dict[str, Any]) -> list[str]:
    """``devices show``'s text: one fact a line."""
    labels = ",".join(f"{k}={v}" for k, v in sorted(d["labels"].items()))
    served = ", ".join(f"{m['model']} v{m['version']}" for m in d["models"])
    lines = [
        f"{d['id']}: {d['presence']}, last seen {d['last_seen'] or 'never'}",
        f"  profile        {d['hardware_profile'] or '?'}",
        f"  agent          {d['agent_version'] or '?'}",
        f"  trust root     {d['trust_root_version'] or '?'}",
        f"  labels         {labels or 'none'}",
        f"  models         {served or 'none'}",
    ]
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
