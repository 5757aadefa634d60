"""Shadow windows and measured speeds as the control plane stores them (SQLite and
PostgreSQL): a telemetry message sent again counts once, the latest speed per model version and
profile wins, the wave's gate sums the windows of its candidate, and retention drops them once
the rollups would be gone."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from common.protocol.messages import ModelTelemetry, Telemetry
from common.protocol.shadow import ShadowReport, VariantSpeed
from control_plane.db.models import Rollout, ShadowReportRecord, VariantSpeedRecord
from control_plane.db.session import make_engine, migrate, session_factory
from control_plane.ingest.quality import carries_quality, quality_rows, store_quality
from control_plane.ingest.retention import compact
from control_plane.rollouts.shadow import shadow_report
from control_plane.settings import ControlPlaneSettings


def _message(seq: int, at: datetime, matched: int, rows_per_s: float) -> Telemetry:
    window = ShadowReport(
        version=2,
        sequence=5,
        requests=10,
        rows=40,
        matched=matched,
        dropped=1,
        max_abs_diff=0.5 * seq,
        rel_error_sum=1.0,
        candidate_ms_sum=20.0,
        serving_ms_sum=10.0,
    )
    speed = VariantSpeed(rows_per_s=rows_per_s, batch_size=8, format="onnx", profile="p")
    model = ModelTelemetry(
        model="m", version=1, requests=10, errors=0, rows=40, batches=5, shadow=window, speed=speed
    )
    return Telemetry(device_id="d", seq=seq, time=at, window_s=1.0, models=[model])


def test_shadow_windows_and_speeds_are_stored_summed_and_expire(db_url: str) -> None:
    migrate(db_url)
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    first, second = _message(1, now, 30, 100.0), _message(2, now, 40, 250.0)
    assert carries_quality(first)
    assert not carries_quality(Telemetry(device_id="d", seq=3, time=now, window_s=1.0))

    async def scenario() -> tuple[dict[str, object], list[tuple[float, str]], int]:
        engine = make_engine(db_url)
        sessions = session_factory(engine)
        async with sessions.begin() as s:
            batch = [quality_rows(m, m.time) for m in (first, first, second)]  # first sent twice
            await store_quality(s, batch, now)
        async with sessions() as s:
            rollout = Rollout(model="m", version=2, sequence=5)
            report = await shadow_report(s, rollout, ["d", "other"], now - timedelta(seconds=1))
            speeds = [
                (r.rows_per_s, r.profile)
                for r in (await s.execute(select(VariantSpeedRecord))).scalars()
            ]
        settings = ControlPlaneSettings(db_url=db_url, telemetry_rollup_retention_s=60)
        await compact(sessions, settings, now=now + timedelta(seconds=120))
        async with sessions() as s:
            left = (
                await s.execute(select(func.count()).select_from(ShadowReportRecord))
            ).scalar_one()
        await engine.dispose()
        return report, speeds, left

    report, speeds, left = asyncio.run(scenario())
    assert report["requests"] == 20 and report["rows"] == 80 and report["matched"] == 70
    assert report["agreement"] == 70 / 80 and report["dropped"] == 2
    assert report["max_abs_diff"] == 1.0 and report["latency_ratio"] == 2.0
    assert report["mean_rel_error"] == 0.1
    assert speeds == [(250.0, "p")]  # the last one of the batch
    assert left == 0
