"""Telemetry retention and downsampling: raw windows older than the raw retention are folded
into per-interval rollups, then deleted; rollups older than their retention are deleted."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from control_plane.db.bulk import insert_ignore
from control_plane.db.models import (
    DeviceSample,
    GroundTruthRecord,
    ShadowReportRecord,
    TelemetryRollup,
    TelemetrySample,
)
from control_plane.db.session import stored_utc
from control_plane.settings import ControlPlaneSettings

log = logging.getLogger("edgefleet.control_plane.maintenance")
CHUNK = 10_000


def expired(cutoff: datetime) -> Select[TelemetrySample]:
    """The next chunk of raw windows older than ``cutoff``, by time: the time index gives both
    the range and the order, so a pass reads what expired, not the table."""
    return (
        select(TelemetrySample)
        .where(TelemetrySample.time < cutoff)
        .order_by(TelemetrySample.time)
        .limit(CHUNK)
    )


async def compact(
    sessions: async_sessionmaker[AsyncSession],
    settings: ControlPlaneSettings,
    now: datetime | None = None,
) -> int:
    """One pass; returns the raw rows folded into rollups."""
    now = now or datetime.now(UTC)
    cutoff = now - timedelta(seconds=settings.telemetry_raw_retention_s)
    bucket_s = settings.telemetry_rollup_s
    folded = 0
    while True:
        async with sessions.begin() as s:
            rows = (await s.execute(expired(cutoff))).scalars().all()
            if not rows:
                break
            buckets: dict[tuple[str, str, int, datetime], dict[str, Any]] = {}
            for r in rows:
                t = stored_utc(r.time)
                bucket = datetime.fromtimestamp(t.timestamp() // bucket_s * bucket_s, UTC)
                b = buckets.setdefault(
                    (r.device_id, r.model, r.version, bucket),
                    {"requests": 0, "errors": 0, "rows": 0, "p99_ms_max": None},
                )
                b["requests"] += r.requests
                b["errors"] += r.errors
                b["rows"] += r.rows
                if r.p99_ms is not None:
                    b["p99_ms_max"] = max(b["p99_ms_max"] or 0.0, r.p99_ms)
            for (device_id, model, version, bucket), b in buckets.items():
                existing = (
                    await s.execute(
                        select(TelemetryRollup).where(
                            TelemetryRollup.device_id == device_id,
                            TelemetryRollup.model == model,
                            TelemetryRollup.version == version,
                            TelemetryRollup.bucket == bucket,
                        )
                    )
                ).scalar_one_or_none()
                if existing is None:
                    await insert_ignore(
                        s,
                        TelemetryRollup.__table__,
                        [
                            {
                                "device_id": device_id,
                                "model": model,
                                "version": version,
                                "bucket": bucket,
                                **b,
                            }
                        ],
                    )
                else:
                    existing.requests += b["requests"]
                    existing.errors += b["errors"]
                    existing.rows += b["rows"]
                    if b["p99_ms_max"] is not None:
                        existing.p99_ms_max = max(existing.p99_ms_max or 0.0, b["p99_ms_max"])
            await s.execute(
                delete(TelemetrySample).where(TelemetrySample.id.in_([r.id for r in rows]))
            )
            folded += len(rows)
    async with sessions.begin() as s:
        await s.execute(delete(DeviceSample).where(DeviceSample.time < cutoff))
        rollup_cutoff = now - timedelta(seconds=settings.telemetry_rollup_retention_s)
        await s.execute(delete(TelemetryRollup).where(TelemetryRollup.bucket < rollup_cutoff))
        # a shadow phase sums its wave's windows since it began: kept as long as the rollups
        await s.execute(
            delete(ShadowReportRecord).where(ShadowReportRecord.received_at < rollup_cutoff)
        )
        # outcomes are few (one row per window and label) and live accuracy looks back far
        await s.execute(
            delete(GroundTruthRecord).where(GroundTruthRecord.received_at < rollup_cutoff)
        )
    return folded


async def run(sessions: async_sessionmaker[AsyncSession], settings: ControlPlaneSettings) -> None:
    while True:
        await asyncio.sleep(settings.maintenance_interval_s)
        try:
            folded = await compact(sessions, settings)
        except Exception:
            log.exception("telemetry maintenance failed")
            continue
        if folded:
            log.info("telemetry downsampled", extra={"rows": folded})
