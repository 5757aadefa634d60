"""How much a model's p99 moves by itself: the p99 gate compares a candidate's request-weighted
p99 over its bake with the previous version's (:mod:`.gates`), so a fleet whose own p99 swings
by 1.8x from one bake-long stretch to the next trips a 1.5x limit with no change at all.

:func:`p99_noise` reads the last ``window_s`` of the model's telemetry on some devices, takes the
version that answered most of it, cuts its windows into bake-long slices (by the control
plane's clock, as the gate does) and reports the request-weighted p99 of each slice against the
whole window's: ``worst_ratio`` is the largest, what the gate would have seen of the version
against itself.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import Device, TelemetrySample
from control_plane.db.session import stored_utc

MAX_ROWS = 100_000
"""Telemetry windows read at most (the newest first)."""


async def selected_devices(s: AsyncSession, selector: dict[str, str]) -> set[str]:
    """The devices whose labels (operator's over reported) match every pair of ``selector``."""
    devices = (await s.execute(select(Device))).scalars()
    return {d.id for d in devices if all(d.labels.get(k) == v for k, v in selector.items())}


async def p99_noise(
    s: AsyncSession,
    model: str,
    devices: set[str],
    *,
    slice_s: float,
    window_s: float,
    now: datetime,
) -> dict[str, Any]:
    t = TelemetrySample
    rows = (
        await s.execute(
            select(t.version, t.device_id, t.received_at, t.requests, t.p99_ms)
            .where(
                t.model == model,
                t.received_at >= now - timedelta(seconds=window_s),
                t.p99_ms.is_not(None),
                t.requests > 0,
            )
            .order_by(t.received_at.desc())
            .limit(MAX_ROWS)
        )
    ).all()
    rows = [r for r in rows if r.device_id in devices]
    answered: dict[int, int] = defaultdict(int)
    for r in rows:
        answered[r.version] += r.requests
    out: dict[str, Any] = {"model": model, "devices": len(devices), "slice_s": slice_s}
    if not answered:
        return out | {"version": None, "slices": 0, "p99_ms": None, "worst_ratio": None}
    version = max(answered, key=lambda v: (answered[v], v))
    start = now - timedelta(seconds=window_s)
    slices: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        if r.version == version:
            at = (stored_utc(r.received_at) - start).total_seconds()
            acc = slices[int(at // slice_s)]
            acc[0] += r.p99_ms * r.requests
            acc[1] += r.requests
    overall = sum(a for a, _ in slices.values()) / sum(n for _, n in slices.values())
    worst = max(a / n for a, n in slices.values())
    return out | {
        "version": version,
        "slices": len(slices),
        "p99_ms": overall,
        "worst_slice_p99_ms": worst,
        "worst_ratio": worst / overall if overall else None,
    }
