"""The rows per second devices measured for the variants they serve, matched to variants.

A device reports what its batch tuning measured with its hardware profile
(:class:`~common.protocol.shadow.VariantSpeed`); the control plane keeps the latest per model
version and profile. Which variant a profile gets is the manifest's rule
(:meth:`~common.protocol.messages.ModelManifest.variant_for`): the one naming the profile, else
a generic one of a format the device runs; a speed is shown on that variant.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import VariantSpeedRecord
from control_plane.db.session import stored_utc

Speeds = dict[tuple[str, int], list[VariantSpeedRecord]]


async def load_speeds(session: AsyncSession) -> Speeds:
    """Every stored speed, by (model, version)."""
    rows = (await session.execute(select(VariantSpeedRecord))).scalars()
    out: Speeds = {}
    for r in rows:
        out.setdefault((r.model, r.version), []).append(r)
    return out


def measured_on(
    variants: list[dict[str, Any]], index: int, speeds: list[VariantSpeedRecord]
) -> list[dict[str, Any]]:
    """The speeds measured on devices that get ``variants[index]``, by profile."""
    variant = variants[index]
    claimed = {p for v in variants for p in v["profiles"]}
    first_generic = {
        fmt: next(i for i, v in enumerate(variants) if not v["profiles"] and v["format"] == fmt)
        for fmt in {v["format"] for v in variants if not v["profiles"]}
    }
    out = []
    for s in sorted(speeds, key=lambda s: s.profile):
        if variant["profiles"]:
            mine = s.profile in variant["profiles"]
        else:
            mine = s.profile not in claimed and first_generic.get(s.format) == index
        if mine:
            out.append(
                {
                    "profile": s.profile,
                    "rows_per_s": s.rows_per_s,
                    "batch_size": s.batch_size,
                    "format": s.format,
                    "placement": s.placement,
                    "device_id": s.device_id,
                    "measured_at": stored_utc(s.measured_at).isoformat(),
                }
            )
    return out
