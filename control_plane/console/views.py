"""What the pages show, computed from the API's documents: the fleet's counts, a page of
devices, a model version's telemetry in chart points. Pure functions, tested without a browser."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from control_plane.ingest.presence import Presence
from control_plane.rollouts.states import ACTIVE

PAGE_SIZE = 50
"""Devices on one page of the device list."""
TOP_LABELS = 20
"""Label values the overview counts, the most common first."""


@dataclass(frozen=True)
class FleetCounts:
    """Devices by presence, per hardware profile and per label (key=value)."""

    total: Counter[str]
    by_profile: dict[str, Counter[str]]
    by_label: dict[str, Counter[str]]
    versions: dict[str, Counter[int]]
    """Devices serving each version, per model."""


def fleet_counts(devices: Iterable[dict[str, Any]]) -> FleetCounts:
    total: Counter[str] = Counter()
    by_profile: defaultdict[str, Counter[str]] = defaultdict(Counter)
    by_label: defaultdict[str, Counter[str]] = defaultdict(Counter)
    versions: defaultdict[str, Counter[int]] = defaultdict(Counter)
    for d in devices:
        presence = d["presence"]
        total[presence] += 1
        by_profile[d["hardware_profile"] or "?"][presence] += 1
        for key, value in d["labels"].items():
            by_label[f"{key}={value}"][presence] += 1
        for m in d["models"]:
            versions[m["model"]][m["version"]] += 1
    common = sorted(by_label, key=lambda k: (-sum(by_label[k].values()), k))[:TOP_LABELS]
    return FleetCounts(
        total,
        dict(sorted(by_profile.items())),
        {k: by_label[k] for k in sorted(common)},
        {m: Counter(dict(sorted(v.items()))) for m, v in sorted(versions.items())},
    )


def active_rollouts(rollouts: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rollouts if r["state"] in ACTIVE]


def serves(device: dict[str, Any], model_version: str) -> bool:
    """``model_version`` is ``model`` or ``model:version``."""
    model, _, version = model_version.partition(":")
    return any(
        m["model"] == model and (not version or str(m["version"]) == version)
        for m in device["models"]
    )


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    number: int
    pages: int
    total: int


def page_of(items: Sequence[dict[str, Any]], number: int, size: int = PAGE_SIZE) -> Page:
    pages = max(1, -(-len(items) // size))
    number = min(max(1, number), pages)
    return Page(list(items[(number - 1) * size : number * size]), number, pages, len(items))


PRESENCES = [p.value for p in Presence]


@dataclass(frozen=True)
class Point:
    """One chart point: a bucket of a model version's telemetry windows."""

    t: float
    """Unix seconds at the bucket's end."""
    requests_per_s: float
    error_rate: float | None
    p50_ms: float | None
    p99_ms: float | None


def point(t: float, windows: Sequence[dict[str, Any]], span_s: float) -> Point:
    """The windows received in one bucket of ``span_s`` seconds: requests a second, errors per
    request, the median of the devices' p50s and the largest p99 (the gate's worst case)."""
    requests = sum(w["requests"] for w in windows)
    errors = sum(w["errors"] for w in windows)
    p50s = [w["p50_ms"] for w in windows if w["p50_ms"] is not None and w["requests"]]
    p99s = [w["p99_ms"] for w in windows if w["p99_ms"] is not None and w["requests"]]
    return Point(
        t,
        requests / span_s,
        errors / requests if requests else None,
        statistics.median(p50s) if p50s else None,
        max(p99s) if p99s else None,
    )


def history(windows: Sequence[dict[str, Any]], now_s: float, span_s: float) -> list[Point]:
    """Buckets of ``span_s`` seconds ending at ``now_s``, oldest first, from windows newest
    first. When the API's page held fewer windows than the hour had (``limit`` reached), the
    buckets start at the oldest window given: an older bucket would be undercounted."""
    buckets: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
    for w in windows:
        received = datetime.fromisoformat(w["received_at"]).timestamp()
        buckets[int((now_s - received) // span_s)].append(w)
    if not buckets:
        return []
    oldest = max(buckets)
    return [point(now_s - i * span_s, buckets.get(i, []), span_s) for i in range(oldest, -1, -1)]
