"""Captured samples as stored (``captured_samples``), read back per model version: a page of
their descriptions, or one sample's archive (docs/model-quality.md, "Data capture")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import CapturedSampleRecord

MAX_PAGE = 1000


def _iso(t: datetime) -> str:
    # SQLite hands times back without their zone; they were stored as UTC
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).isoformat()


def describe(r: CapturedSampleRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "sample_id": r.sample_id,
        "device_id": r.device_id,
        "model": r.model,
        "version": r.version,
        "captured_at": _iso(r.captured_at),
        "received_at": _iso(r.received_at),
        "trigger": r.trigger,
        "rows": r.rows,
        "size_bytes": r.size_bytes,
    }


async def sample_page(
    s: AsyncSession, model: str, version: int, *, after: int, limit: int
) -> dict[str, Any]:
    """Samples of ``model`` v``version`` with ids after ``after``, oldest first; ``next``
    is the ``after`` of the following page (None on the last)."""
    columns = [c for c in CapturedSampleRecord.__table__.columns if c.name != "data"]
    rows = (
        await s.execute(
            select(*columns)
            .where(
                CapturedSampleRecord.model == model,
                CapturedSampleRecord.version == version,
                CapturedSampleRecord.id > after,
            )
            .order_by(CapturedSampleRecord.id)
            .limit(limit + 1)
        )
    ).all()
    page = [describe(CapturedSampleRecord(**row._asdict())) for row in rows[:limit]]
    return {"samples": page, "next": page[-1]["id"] if len(rows) > limit else None}


async def sample_data(s: AsyncSession, model: str, version: int, row_id: int) -> bytes | None:
    """The archive of sample ``row_id`` of ``model`` v``version``; None if there is none."""
    data: bytes | None = await s.scalar(
        select(CapturedSampleRecord.data).where(
            CapturedSampleRecord.id == row_id,
            CapturedSampleRecord.model == model,
            CapturedSampleRecord.version == version,
        )
    )
    return data


async def sample_versions(s: AsyncSession, model: str) -> list[dict[str, Any]]:
    """Per version of ``model``: its samples, their bytes, devices and time span."""
    r = CapturedSampleRecord
    rows = (
        await s.execute(
            select(
                r.version,
                func.count(),
                func.sum(r.size_bytes),
                func.count(func.distinct(r.device_id)),
                func.min(r.captured_at),
                func.max(r.captured_at),
            )
            .where(r.model == model)
            .group_by(r.version)
            .order_by(r.version)
        )
    ).all()
    return [
        {
            "version": version,
            "samples": n,
            "bytes": int(size or 0),
            "devices": devices,
            "first": _iso(first) if first else None,
            "last": _iso(last) if last else None,
        }
        for version, n, size, devices, first, last in rows
    ]
