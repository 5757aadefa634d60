"""What each device of a rollout is doing, as it reports it: the last update event it sent for
the rollout (downloading, so many bytes of so many; verified; staged; in its health window, so
many seconds left; committed; rolled back, and why). A device's row in the rollout says
``sent`` from publication to outcome; its phase says where it is in between."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import UpdateEventRecord
from control_plane.db.session import required_utc


def phase_doc(e: UpdateEventRecord, now: datetime) -> dict[str, Any]:
    at = required_utc(e.time)
    doc: dict[str, Any] = {"state": e.state, "at": at.isoformat()}
    if e.state == "downloading" and e.bytes_total:
        doc |= {"bytes_done": e.bytes_done, "bytes_total": e.bytes_total}
    if e.progress is not None:
        doc["progress"] = e.progress
    if e.state == "active" and e.window_s is not None:
        doc["window_s"] = e.window_s
        doc["window_left_s"] = max(0.0, e.window_s - (now - at).total_seconds())
    if e.code:
        doc["code"] = e.code
    if e.reason:
        doc["reason"] = e.reason
    return doc


async def device_phases(session: AsyncSession, rollout_id: int) -> dict[str, dict[str, Any]]:
    """The last event of each device of the rollout, by device id."""
    tag = f"rollout-{rollout_id}"
    last = (
        select(UpdateEventRecord.device_id, func.max(UpdateEventRecord.id).label("id"))
        .where(UpdateEventRecord.rollout_id == tag)
        .group_by(UpdateEventRecord.device_id)
        .subquery()
    )
    rows = (
        await session.execute(
            select(UpdateEventRecord).join(last, UpdateEventRecord.id == last.c.id)
        )
    ).scalars()
    now = datetime.now(UTC)
    return {e.device_id: phase_doc(e, now) for e in rows}
