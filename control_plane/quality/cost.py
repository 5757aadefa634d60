"""Cost per thousand predictions: the operator's hourly rate of each device (by label, by
hardware profile, or the default) times the device time a version's batches took on it
(telemetry's ``busy_s``), over the predictions (rows) it answered there.

A device's rate is its first label rate that matches (labels in name order), else its
profile's, else the default; a device with none is *unpriced*: its rows are counted apart,
not in the cost per thousand. Only raw telemetry windows are read (within
``telemetry_raw_retention_s``); rollups keep no busy time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from control_plane.db.models import CostRate, Device, Rollout, TelemetrySample
from control_plane.db.session import stored_utc

DEFAULT_KEY = "*"
REFRESH_S = 30.0
"""How often ingest's copy of every device's rate is read again (at once after a change)."""

log = logging.getLogger("edgefleet.control_plane.cost")


class RateKind(StrEnum):
    LABEL = "label"
    PROFILE = "profile"
    DEFAULT = "default"


@dataclass(frozen=True)
class Rates:
    """Every rate set, by what it applies to."""

    labels: dict[str, float] = field(default_factory=dict)
    """``name=value`` -> per hour."""
    profiles: dict[str, float] = field(default_factory=dict)
    default: float | None = None

    def of(self, device: Device | None) -> tuple[float, str] | None:
        """``device``'s rate per hour and where it comes from (``label site=a``), if any."""
        if device is not None:
            for name, value in sorted(device.labels.items()):
                rate = self.labels.get(f"{name}={value}")
                if rate is not None:
                    return rate, f"label {name}={value}"
            if device.hardware_profile in self.profiles:
                profile = device.hardware_profile
                return self.profiles[profile], f"profile {profile}"
        if self.default is not None:
            return self.default, "default"
        return None


async def load_rates(s: AsyncSession) -> Rates:
    rows = (await s.execute(select(CostRate))).scalars().all()
    return Rates(
        labels={r.key: r.per_hour for r in rows if r.kind == RateKind.LABEL},
        profiles={r.key: r.per_hour for r in rows if r.kind == RateKind.PROFILE},
        default=next((r.per_hour for r in rows if r.kind == RateKind.DEFAULT), None),
    )


async def version_cost(
    s: AsyncSession,
    model: str,
    version: int,
    since: datetime,
    devices: set[str] | None = None,
) -> dict[str, Any]:
    """What ``version`` cost since ``since`` (by the control plane's clock), on ``devices``
    (None: every device): the whole and per device."""
    query = (
        select(
            TelemetrySample.device_id,
            func.sum(TelemetrySample.busy_s),
            func.sum(TelemetrySample.rows),
        )
        .where(
            TelemetrySample.model == model,
            TelemetrySample.version == version,
            TelemetrySample.received_at >= since,
        )
        .group_by(TelemetrySample.device_id)
        .order_by(TelemetrySample.device_id)
    )
    sums = [(d, float(b or 0), int(r or 0)) for d, b, r in await s.execute(query)]
    if devices is not None:
        sums = [row for row in sums if row[0] in devices]
    rates = await load_rates(s)
    known = {
        d.id: d
        for d in (
            await s.execute(select(Device).where(Device.id.in_([d for d, _, _ in sums])))
        ).scalars()
    }
    per_device: list[dict[str, Any]] = []
    cost, priced_rows, busy_total, unpriced = 0.0, 0, 0.0, []
    for device_id, busy_s, rows in sums:
        rate = rates.of(known.get(device_id))
        if rate is None:
            unpriced.append(device_id)
            continue
        spent = rate[0] * busy_s / 3600
        cost += spent
        priced_rows += rows
        busy_total += busy_s
        per_device.append(
            {
                "device_id": device_id,
                "per_hour": rate[0],
                "rate": rate[1],
                "busy_s": round(busy_s, 6),
                "rows": rows,
                "cost": spent,
            }
        )
    return {
        "model": model,
        "version": version,
        "since": since.isoformat(),
        "rows": priced_rows,
        "busy_s": round(busy_total, 6),
        "cost": cost,
        "per_1k_predictions": cost / priced_rows * 1000 if priced_rows else None,
        "devices": per_device,
        "unpriced_devices": unpriced,
    }


async def rollout_cost(s: AsyncSession, rollout: Rollout) -> dict[str, Any]:
    """The rollout report's cost: its version's per thousand predictions on its devices since
    it began, beside the version most of them ran before (the baseline) over the same time."""
    since = stored_utc(rollout.created_at)
    devices = {d.device_id for d in rollout.devices}
    before = Counter(d.previous_version for d in rollout.devices if d.previous_version)
    out: dict[str, Any] = {"since": since.isoformat()}
    for role, version in (("candidate", rollout.version), ("baseline", _most(before))):
        if version is None:
            out[role] = None
            continue
        cost = await version_cost(s, rollout.model, version, since, devices)
        out[role] = {k: cost[k] for k in ("version", "rows", "busy_s", "per_1k_predictions")}
    return out


def _most(counts: Counter[int]) -> int | None:
    return counts.most_common(1)[0][0] if counts else None


class RateBook:
    """Every device's rate, for ingest to charge each telemetry window as it stores it (the
    fleet's ``edgefleet_fleet_cost_total``): read every :data:`REFRESH_S` and after a change of
    rates; a device unknown at the last read is charged the default."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions
        self._rates: dict[str, float] = {}
        self._known: set[str] = set()
        self._default: float | None = None
        self._changed = asyncio.Event()

    def rate_of(self, device_id: str) -> float | None:
        if device_id not in self._known:
            self._changed.set()  # new since the last read: read again soon
        return self._rates.get(device_id, self._default)

    def changed(self) -> None:
        self._changed.set()

    async def refresh(self) -> None:
        async with self.sessions() as s:
            rates = await load_rates(s)
            devices = (await s.execute(select(Device))).scalars().all()
        found = {d.id: rates.of(d) for d in devices}
        self._rates = {d: r[0] for d, r in found.items() if r is not None}
        self._known, self._default = set(found), rates.default

    async def run(self) -> None:
        while True:
            self._changed.clear()
            try:
                await self.refresh()
            except Exception:  # the database away: the next pass reads again
                log.exception("cost rates not read")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_S):
                    await self._changed.wait()
