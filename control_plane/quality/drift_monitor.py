"""Input and output drift as telemetry comes in: devices' sketches of a version's inputs,
outputs and top-1 classes against its reference set.

Ingest hands over every telemetry message that carries sketches (:meth:`DriftMonitor.offer`,
a bounded queue, never waiting). One task takes them in order and, per (model, version,
device), merges each window into what it holds of the earlier ones, weighted down by
``decay`` at every new window, so a shift weighs half of what is judged after one window and
seven eighths after three. Once ``min_rows`` sampled rows are merged, every feature is compared
with the reference set (:mod:`control_plane.quality.drift`) and the result replaces the
device's row in ``input_drift``; every ``fleet_interval_s`` the devices' merged windows are
added up and judged as the fleet (``device_id`` ``*``).

What is merged is stored (``drift_sketches``, with the last ``seq`` merged) in the same
transaction as the judgement, its rows locked meanwhile: every replica merges the windows it
ingests into the same state, and judges the fleet from every device's (those heard from within
``forget_after_s``), and a restarted control plane goes on from there. A window sent again, or
that another replica merged already, is not merged twice (:class:`Merged`); windows that
replicas take out of order are merged in the order they are stored (with ``decay``, each
weighs a little more or less than in the device's order; the rows do not change).

A device or the fleet crossing ``psi_threshold`` is logged as a warning ("input drift over
threshold") and counted in ``edgefleet_input_drift_alerts``, once per crossing (a device's
crossing is stored with its windows; the fleet's is each replica's own, as are the gauges).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from common.protocol.drift import InputSketch
from common.protocol.messages import ModelTelemetry, Telemetry
from control_plane.db.models import DriftSketch, InputDrift, Model, ModelVersion
from control_plane.metrics import FleetMetrics
from control_plane.quality.drift import (
    Distribution,
    FeatureDrift,
    distribution,
    feature_drift,
    reference_features,
    sketch_bins,
    values_bins,
)
from control_plane.quality.reference import ReferenceSet, load_reference
from control_plane.registry.store import ArtifactStore
from control_plane.settings.drift import DriftSettings

log = logging.getLogger("edgefleet.control_plane.drift")

OUTPUT = "output:"
TOP1 = "top1:"
"""Prefixes of the judged names of a version's outputs and their top-1 classes."""

Named = tuple[str, InputSketch]
"""A sketch and the name it is judged by."""

FLEET = "*"
"""The ``device_id`` of the fleet-wide row."""
PRUNE_WEIGHT = 1e-3
PRUNE_INTERVAL_S = 60.0
ATTEMPTS = 3
"""Tries of a batch's transaction (another replica making a device's row first fails one)."""
CHUNK = 1000
"""Device ids per ``IN`` list."""
SEQ_MEMORY = 64
"""Windows of a device remembered by ``seq`` (:class:`Merged`): one sent again later than
this many newer ones is merged twice; the agent resends within seconds."""
Key = tuple[str, int, str]
"""(model, version, device id), or the fleet's (device id :data:`FLEET`)."""
Judged = tuple[Key, float, int, list["FeatureDrift"]]
"""What was judged: the key, its rows and windows, and each feature's drift."""


@dataclass
class _Feature:
    bins: dict[float, float] = field(default_factory=dict)
    count: float = 0.0
    total: float = 0.0
    """Sum of the values (mean = total / count)."""

    def decay(self, factor: float) -> None:
        self.bins = {v: w * factor for v, w in self.bins.items() if w * factor > PRUNE_WEIGHT}
        self.count *= factor
        self.total *= factor

    def add(self, other: _Feature) -> None:
        for v, w in other.bins.items():
            self.bins[v] = self.bins.get(v, 0.0) + w
        self.count += other.count
        self.total += other.total


@dataclass
class _Held:
    """One device's (or the fleet's) merged windows of one model version."""

    rows: float = 0.0
    windows: int = 0
    accuracy: dict[str, float] = field(default_factory=dict)
    features: dict[tuple[str, int], _Feature] = field(default_factory=dict)
    over: bool = False

    def merge(self, sketches: list[Named], decay: float) -> None:
        self.rows *= decay
        self.windows += 1
        for f in self.features.values():
            f.decay(decay)
        self.rows += max((s.sampled_rows for _, s in sketches), default=0)
        for name, sketch in sketches:
            if self.accuracy.get(name, sketch.relative_accuracy) != sketch.relative_accuracy:
                self.features = {k: v for k, v in self.features.items() if k[0] != name}
            self.accuracy[name] = sketch.relative_accuracy
            for fs in sketch.features:
                window = _Feature(
                    sketch_bins(fs, sketch.relative_accuracy),
                    float(fs.count),
                    float(fs.count * fs.mean) if fs.mean is not None else 0.0,
                )
                self.features.setdefault((name, fs.feature), _Feature()).add(window)

    def add(self, other: _Held) -> None:
        """Add a device's windows to the fleet's: those of an input at another accuracy than
        the fleet's (the latest seen) are left out, as their bins are another grid."""
        self.rows += other.rows
        self.windows += other.windows
        self.accuracy |= other.accuracy
        for k, f in other.features.items():
            if other.accuracy[k[0]] == self.accuracy[k[0]]:
                self.features.setdefault(k, _Feature()).add(f)

    def doc(self) -> dict[str, Any]:
        """As stored (``DriftSketch.sketch``): JSON has no float keys, so bins are two lists."""
        return {
            "accuracy": self.accuracy,
            "features": [
                [name, feature, f.count, f.total, list(f.bins), list(f.bins.values())]
                for (name, feature), f in self.features.items()
            ],
        }

    @classmethod
    def of(cls, row: DriftSketch) -> _Held:
        features = {
            (name, feature): _Feature(dict(zip(values, weights, strict=True)), count, total)
            for name, feature, count, total, values, weights in row.sketch["features"]
        }
        return cls(row.rows, row.windows, dict(row.sketch["accuracy"]), features, row.over)


@dataclass(frozen=True)
class _Reference:
    sha256: str
    inputs: ReferenceSet
    bins: dict[tuple[str, int, float], tuple[Distribution, float]] = field(default_factory=dict)

    def values(self, name: str) -> np.ndarray | None:
        """The reference's array for a judged name: an input, an output's expected values, or
        the classes they score highest (without expected outputs: the labels)."""
        ref = self.inputs
        if name.startswith(OUTPUT):
            return ref.outputs.get(name.removeprefix(OUTPUT))
        if name.startswith(TOP1):
            expected = ref.outputs.get(name.removeprefix(TOP1))
            if expected is not None and expected.ndim == 2:
                return np.asarray(expected.argmax(axis=1))
            return ref.labels if not ref.outputs else None
        return ref.inputs.get(name)

    def feature(self, name: str, feature: int, accuracy: float) -> tuple[Distribution, float]:
        key = (name, feature, accuracy)
        if key not in self.bins:
            array = self.values(name)
            if array is None:
                raise KeyError(key)
            values = reference_features(array, [feature]).get(feature)
            if values is None or not len(values):
                raise KeyError(key)
            self.bins[key] = (distribution(values_bins(values, accuracy)), float(values.mean()))
        return self.bins[key]


class DriftMonitor:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        store: ArtifactStore,
        metrics: FleetMetrics,
        settings: DriftSettings,
    ) -> None:
        self.sessions = sessions
        self.store = store
        self.metrics = metrics
        self.settings = settings
        self._queue: deque[tuple[str, Telemetry]] = deque()
        self._arrived = asyncio.Event()
        self._fleet_at: dict[tuple[str, int], float] = {}
        self._references: dict[tuple[str, int], _Reference | None] = {}
        self._psi: dict[tuple[str, int], dict[str, float]] = {}
        """Per model version: the latest largest PSI of each device this replica judged, for
        the worst's gauge."""
        self._seen: dict[Key, float] = {}
        """When this replica last merged each device's windows of a version (monotonic)."""
        self._pruned_at = time.monotonic()
        self._fleet_over: dict[tuple[str, int], bool] = {}
        self.dropped = 0

    def offer(self, device_id: str, message: Telemetry) -> None:
        """Queue a telemetry message for judging if it carries sketches (ingest's hook)."""
        if not any(m.inputs or m.outputs or m.top1 for m in message.models):
            return
        if len(self._queue) >= self.settings.queue_limit:
            self.dropped += 1
            return
        self._queue.append((device_id, message))
        self._arrived.set()

    async def run(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), 500))]
                try:
                    await self.process(batch)
                except Exception:  # one bad batch must not end drift for good
                    log.exception("input drift not judged", extra={"messages": len(batch)})

    async def process(self, batch: list[tuple[str, Telemetry]]) -> None:
        """Merge ``batch``'s windows into the stored sketches, judge what changed, store the
        results and the sketches, in one transaction."""
        windows = _windows(batch)
        if not windows:
            return
        now = time.monotonic()
        for key in windows:
            self._seen[key] = now
        versions = {key[:2] for key in windows}
        fleets = set()
        for mv in versions:
            if now - self._fleet_at.get(mv, -1e18) >= self.settings.fleet_interval_s:
                self._fleet_at[mv] = now
                fleets.add(mv)
        references = {mv: await self._reference(*mv) for mv in versions}
        for attempt in range(1, ATTEMPTS + 1):
            try:
                judged = await self._merge_and_judge(windows, references, fleets)
                break
            except (IntegrityError, OperationalError):
                # another replica made a device's row first (or SQLite was busy): its row is
                # there now, and locked, for the next try
                if attempt == ATTEMPTS:
                    raise
        self._gauges(judged)
        if now - self._pruned_at > PRUNE_INTERVAL_S:
            await self._forget(now)
            self._pruned_at = now

    async def _merge_and_judge(
        self,
        windows: dict[Key, list[tuple[int, list[Named]]]],
        references: dict[tuple[str, int], _Reference | None],
        fleets: set[tuple[str, int]],
    ) -> list[Judged]:
        at = datetime.now(UTC)
        async with self.sessions.begin() as s:
            rows = await _locked(s, sorted(windows))
            held: dict[Key, _Held] = {}
            for key in sorted(windows):
                row = rows.get(key)
                h = _Held.of(row) if row is not None else _Held()
                seqs = Merged(row.sketch.get("seqs", []) if row is not None else [])
                fresh = [(seq, inputs) for seq, inputs in windows[key] if seqs.take(seq)]
                if not fresh:
                    continue  # every one sent again, or merged by another replica already
                for _, sketches in fresh:
                    h.merge(sketches, self.settings.decay)
                if row is None:
                    row = rows[key] = DriftSketch(model=key[0], version=key[1], device_id=key[2])
                    s.add(row)
                # complete before the fleet's query flushes it
                row.last_seq, row.rows, row.windows, row.over = seqs.last, h.rows, h.windows, h.over
                row.sketch, row.updated_at = {**h.doc(), "seqs": seqs.seqs}, at
                held[key] = h
            for mv in sorted(fleets):
                held[(*mv, FLEET)] = await self._fleet(s, mv, held, at)
            judged = await asyncio.to_thread(self._judge_all, held, references)
            await self._store(s, judged, held, at)
            for key, h in held.items():
                if key in rows:
                    rows[key].over = h.over
        return judged

    async def _fleet(
        self, s: AsyncSession, mv: tuple[str, int], held: dict[Key, _Held], at: datetime
    ) -> _Held:
        """Every device's stored windows of ``mv`` heard from within ``forget_after_s``,
        added up (those this batch merged as merged now)."""
        since = at - timedelta(seconds=self.settings.forget_after_s)
        rows = await s.execute(
            select(DriftSketch).where(
                DriftSketch.model == mv[0],
                DriftSketch.version == mv[1],
                DriftSketch.updated_at >= since,
            )
        )
        fleet = _Held()
        for row in rows.scalars():
            fleet.add(held.get((row.model, row.version, row.device_id)) or _Held.of(row))
        return fleet

    def _judge_all(
        self, held: dict[Key, _Held], references: dict[tuple[str, int], _Reference | None]
    ) -> list[Judged]:
        out = []
        for key in sorted(held):
            reference = references[key[:2]]
            h = held[key]
            if reference is None or h.rows < self.settings.min_rows:
                continue
            drifts = self._judge(h, reference)
            if drifts:
                out.append((key, h.rows, h.windows, drifts))
        return out

    def _judge(self, held: _Held, reference: _Reference) -> list[FeatureDrift]:
        drifts = []
        for (name, feature), f in sorted(held.features.items()):
            if not f.bins:
                continue
            try:
                ref, ref_mean = reference.feature(name, feature, held.accuracy[name])
            except KeyError:
                continue  # a feature the reference does not have (another shape)
            live = distribution(f.bins)
            mean = f.total / f.count if f.count else None
            drifts.append(
                feature_drift(name, feature, live, ref, mean, ref_mean, self.settings.bins)
            )
        return drifts

    async def _reference(self, model: str, version: int) -> _Reference | None:
        async with self.sessions() as s:
            row = (
                await s.execute(
                    select(ModelVersion.reference, ModelVersion.validation)
                    .join(Model)
                    .where(Model.name == model, ModelVersion.version == version)
                )
            ).one_or_none()
        sha, validation = row if row is not None else (None, None)
        if isinstance(validation, dict) and validation.get("model_reference"):
            sha = validation["model_reference"]  # a pipeline's: at its model step
        digest = sha.get("sha256") if isinstance(sha, dict) else None
        cached = self._references.get((model, version))
        if digest is None:
            return None
        if cached is None or cached.sha256 != digest:
            loaded = await asyncio.to_thread(load_reference, self.store.path(digest))
            cached = self._references[(model, version)] = _Reference(digest, loaded)
        return cached

    async def _store(
        self, s: AsyncSession, judged: list[Judged], held: dict[Key, _Held], at: datetime
    ) -> None:
        for (model, version, device_id), rows, windows, drifts in judged:
            worst = max(drifts, key=lambda d: d.psi)
            row = (
                await s.execute(
                    select(InputDrift).where(
                        InputDrift.model == model,
                        InputDrift.version == version,
                        InputDrift.device_id == device_id,
                    )
                )
            ).scalar_one_or_none()
            if row is None:
                row = InputDrift(model=model, version=version, device_id=device_id)
                s.add(row)
            row.computed_at, row.rows, row.windows, row.psi = at, rows, windows, worst.psi
            row.ks = max(d.ks for d in drifts)
            row.wasserstein = max(d.wasserstein for d in drifts)
            row.feature = worst.label
            row.features = [d.to_dict() for d in drifts]
            self._alert((model, version, device_id), held[(model, version, device_id)], worst)

    def _gauges(self, judged: list[Judged]) -> None:
        for (model, version, device_id), _, _, drifts in judged:
            worst_psi = max(d.psi for d in drifts)
            if device_id == FLEET:
                self.metrics.drift_psi.labels(model, str(version), FLEET).set(worst_psi)
            else:
                self._psi.setdefault((model, version), {})[device_id] = worst_psi
        for model, version in {(m, v) for (m, v, d), _, _, _ in judged if d != FLEET}:
            largest = max(self._psi[(model, version)].values())
            self.metrics.drift_psi.labels(model, str(version), "max").set(largest)

    async def _forget(self, now: float) -> None:
        """Drop the stored windows of device versions not heard from within
        ``forget_after_s`` (their stored drift stays), and this replica's gauges of them."""
        before = now - self.settings.forget_after_s
        for key in [k for k, at in self._seen.items() if at < before]:
            del self._seen[key]
            self._psi.get(key[:2], {}).pop(key[2], None)
        since = datetime.now(UTC) - timedelta(seconds=self.settings.forget_after_s)
        async with self.sessions.begin() as s:
            await s.execute(delete(DriftSketch).where(DriftSketch.updated_at < since))

    def _alert(self, key: Key, held: _Held, worst: FeatureDrift) -> None:
        """Log and count a crossing of ``psi_threshold``, once per crossing (a device's state
        is stored with its windows; the fleet's, this replica's)."""
        model, version, device_id = key
        threshold = self.settings.psi_threshold
        over = worst.psi > threshold
        if device_id == FLEET:
            was = self._fleet_over.get(key[:2], False)
            self._fleet_over[key[:2]] = over
        else:
            was, held.over = held.over, over
        if over and not was:
            self.metrics.drift_alerts.labels(model, str(version)).inc()
            log.warning(
                "input drift over threshold",
                extra={
                    "model": model,
                    "version": version,
                    "device_id": device_id,
                    "feature": worst.label,
                    "psi": round(worst.psi, 4),
                    "ks": round(worst.ks, 4),
                    "threshold": threshold,
                    "windows": held.windows,
                },
            )
        elif was and not over:
            log.info(
                "input drift back under threshold",
                extra={"model": model, "version": version, "device_id": device_id},
            )


class Merged:
    """The telemetry ``seq`` of a device's last :data:`SEQ_MEMORY` windows merged. Replicas
    take a device's windows in no set order (a shared subscription deals them out, each
    replica stores its batches when it can): one older than the newest merged is still merged
    unless it is one of these, or older than all of them."""

    def __init__(self, seqs: list[int]) -> None:
        self.seqs = sorted(seqs)

    @property
    def last(self) -> int:
        return self.seqs[-1] if self.seqs else 0

    def take(self, seq: int) -> bool:
        """Whether ``seq`` is to be merged (then remembered)."""
        if seq in self.seqs or (len(self.seqs) >= SEQ_MEMORY and seq < self.seqs[0]):
            return False
        self.seqs = sorted([*self.seqs, seq])[-SEQ_MEMORY:]
        return True


def judged_sketches(m: ModelTelemetry) -> list[Named]:
    """A version's window as judged: its inputs by name, its outputs as ``output:<name>`` and
    its outputs' top-1 classes as ``top1:<name>`` (:meth:`_Reference.values` finds each)."""
    return [
        *((i.name, i) for i in m.inputs),
        *((f"{OUTPUT}{o.name}", o) for o in m.outputs),
        *((f"{TOP1}{t.name}", t) for t in m.top1),
    ]


def _windows(
    batch: list[tuple[str, Telemetry]],
) -> dict[Key, list[tuple[int, list[Named]]]]:
    """A batch's sketches by (model, version, device), each device's in ``seq`` order."""
    out: dict[Key, list[tuple[int, list[Named]]]] = {}
    for device_id, message in batch:
        for m in message.models:
            sketches = judged_sketches(m)
            if sketches:
                out.setdefault((m.model, m.version, device_id), []).append((message.seq, sketches))
    for windows in out.values():
        windows.sort(key=lambda w: w[0])
    return out


async def _locked(s: AsyncSession, keys: list[Key]) -> dict[Key, DriftSketch]:
    """The stored windows of ``keys``, locked until the transaction ends (on PostgreSQL: two
    replicas merging one device's windows take turns), always in one order (no deadlock)."""
    out: dict[Key, DriftSketch] = {}
    by_version: dict[tuple[str, int], list[str]] = {}
    for model, version, device_id in keys:
        by_version.setdefault((model, version), []).append(device_id)
    for (model, version), devices in sorted(by_version.items()):
        for start in range(0, len(devices), CHUNK):
            rows = await s.execute(
                select(DriftSketch)
                .where(
                    DriftSketch.model == model,
                    DriftSketch.version == version,
                    DriftSketch.device_id.in_(devices[start : start + CHUNK]),
                )
                .order_by(DriftSketch.device_id)
                .with_for_update()
            )
            out |= {(r.model, r.version, r.device_id): r for r in rows.scalars()}
    return out
