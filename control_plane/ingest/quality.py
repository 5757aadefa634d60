"""What telemetry says about model quality, stored beside its windows: the shadow comparisons
of staged candidates (summed by a rollout's shadow gate), the rows per second devices
measured for what they serve (the latest per model version and hardware profile, which
``models list`` shows), and the outcomes apps posted for predictions (ground truth: live
accuracy).

Few messages carry any (a shadow runs during a rollout's shadow phase; a speed comes once per
load; outcomes only where apps post them), so they take their own small path through the
batch: the telemetry rows of every message stay as they are.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from common.protocol.messages import Telemetry
from control_plane.db.bulk import insert_ignore
from control_plane.db.models import GroundTruthRecord, ShadowReportRecord, VariantSpeedRecord

Extras = tuple[tuple[str, dict[str, Any]], ...]
"""("shadow", "speed" or "truth", row) of one telemetry message."""


def carries_quality(t: Telemetry) -> bool:
    return any(
        m.shadow is not None or m.speed is not None or m.ground_truth is not None for m in t.models
    )


def quality_rows(t: Telemetry, at: datetime) -> Extras:
    """The shadow and speed rows of a telemetry message (``at``: its time, in UTC)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for m in t.models:
        if (s := m.shadow) is not None:
            out.append(
                (
                    "shadow",
                    {
                        "device_id": t.device_id,
                        "seq": t.seq,
                        "time": at,
                        "model": m.model,
                        "version": s.version,
                        "sequence": s.sequence,
                        "serving_version": m.version,
                        "requests": s.requests,
                        "rows": s.rows,
                        "matched": s.matched,
                        "dropped": s.dropped,
                        "errors": s.errors,
                        "max_abs_diff": s.max_abs_diff,
                        "rel_error_sum": s.rel_error_sum,
                        "candidate_ms_sum": s.candidate_ms_sum,
                        "serving_ms_sum": s.serving_ms_sum,
                    },
                )
            )
        if (v := m.speed) is not None:
            out.append(
                (
                    "speed",
                    {
                        "model": m.model,
                        "version": m.version,
                        "profile": v.profile,
                        "format": v.format,
                        "rows_per_s": v.rows_per_s,
                        "batch_size": v.batch_size,
                        "placement": v.placement,
                        "device_id": t.device_id,
                    },
                )
            )
        if (g := m.ground_truth) is not None:
            out += [
                (
                    "truth",
                    {
                        "device_id": t.device_id,
                        "seq": t.seq,
                        "time": at,
                        "model": m.model,
                        "version": m.version,
                        "task": g.task.value,
                        "label": group.label,
                        "outcomes": group.outcomes,
                        "correct": group.correct,
                        "abs_error_sum": group.abs_error_sum,
                        "squared_error_sum": group.squared_error_sum,
                    },
                )
                for group in g.groups
            ]
    return tuple(out)


async def store_quality(session: AsyncSession, extras: list[Extras], now: datetime) -> None:
    """Write a batch's shadow windows (a message sent again is stored once) and speeds (the
    last one per model version and profile wins)."""
    shadows = [
        row | {"received_at": now} for rows in extras for kind, row in rows if kind == "shadow"
    ]
    speeds: dict[tuple[str, int, str], dict[str, Any]] = {}
    for rows in extras:
        for kind, row in rows:
            if kind == "speed":
                speeds[(row["model"], row["version"], row["profile"])] = row | {"measured_at": now}
    await insert_ignore(session, ShadowReportRecord.__table__, shadows)
    truths = [
        row | {"received_at": now} for rows in extras for kind, row in rows if kind == "truth"
    ]
    await insert_ignore(session, GroundTruthRecord.__table__, truths)
    if speeds:
        v = VariantSpeedRecord
        await session.execute(
            delete(v).where(tuple_(v.model, v.version, v.profile).in_(list(speeds)))
        )
        await insert_ignore(session, v.__table__, list(speeds.values()))
