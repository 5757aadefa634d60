"""Input drift as telemetry comes in: devices' input sketches against each version's
reference set.

Ingest hands over every telemetry message that carries sketches (:meth:`DriftMonitor.offer`,
a bounded queue, never waiting). One task takes them in order and, per (model, version,
device), merges each window into what it holds of the earlier ones, weighted down by
``decay`` at every new window, so a shift weighs half of what is judged after one window and
seven eighths after three. Once ``min_rows`` sampled rows are held, every feature is compared
with the reference set (:mod:`control_plane.quality.drift`) and the result replaces the
device's row in ``input_drift``; every ``fleet_interval_s`` the devices' merged windows are
added up and judged as the fleet (``device_id`` ``*``).

A device or the fleet crossing ``psi_threshold`` is logged as a warning ("input drift over
threshold") and counted in ``edgefleet_input_drift_alerts``, once per crossing. What is held
lives in this process: a restarted control plane judges again after ``min_rows``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from common.protocol.drift import InputSketch
from common.protocol.messages import Telemetry
from control_plane.db.models import InputDrift, Model, ModelVersion
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
from control_plane.quality.settings import DriftSettings
from control_plane.registry.store import ArtifactStore

log = logging.getLogger("edgefleet.control_plane.drift")

FLEET = "*"
"""The ``device_id`` of the fleet-wide row."""
PRUNE_WEIGHT = 1e-3
PRUNE_INTERVAL_S = 60.0


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

    def merge(self, inputs: list[InputSketch], decay: float) -> None:
        self.rows *= decay
        self.windows += 1
        for f in self.features.values():
            f.decay(decay)
        self.rows += max((i.sampled_rows for i in inputs), default=0)
        for sketch in inputs:
            if self.accuracy.get(sketch.name, sketch.relative_accuracy) != sketch.relative_accuracy:
                self.features = {k: v for k, v in self.features.items() if k[0] != sketch.name}
            self.accuracy[sketch.name] = sketch.relative_accuracy
            for fs in sketch.features:
                window = _Feature(
                    sketch_bins(fs, sketch.relative_accuracy),
                    float(fs.count),
                    float(fs.count * fs.mean) if fs.mean is not None else 0.0,
                )
                self.features.setdefault((sketch.name, fs.feature), _Feature()).add(window)


@dataclass(frozen=True)
class _Reference:
    sha256: str
    inputs: ReferenceSet
    bins: dict[tuple[str, int, float], tuple[Distribution, float]] = field(default_factory=dict)

    def feature(self, name: str, feature: int, accuracy: float) -> tuple[Distribution, float]:
        key = (name, feature, accuracy)
        if key not in self.bins:
            values = reference_features(self.inputs.inputs[name], [feature]).get(feature)
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
        self._held: dict[tuple[str, int, str], _Held] = {}
        self._last_seq: dict[str, int] = {}
        self._fleet_at: dict[tuple[str, int], float] = {}
        self._references: dict[tuple[str, int], _Reference | None] = {}
        self._psi: dict[tuple[str, int], dict[str, float]] = {}
        """Per model version: the latest largest PSI of each device, for the worst's gauge."""
        self._seen: dict[tuple[str, int, str], float] = {}
        """When each device's windows of a version were last merged (monotonic)."""
        self._pruned_at = time.monotonic()
        self._fleet_over: dict[tuple[str, int], bool] = {}
        self.dropped = 0

    def offer(self, device_id: str, message: Telemetry) -> None:
        """Queue a telemetry message for judging if it carries sketches (ingest's hook)."""
        if not any(m.inputs for m in message.models):
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
        """Merge ``batch``'s windows, judge what changed, store the results."""
        touched: set[tuple[str, int, str]] = set()
        for device_id, message in batch:
            if message.seq <= self._last_seq.get(device_id, 0):
                continue  # a window sent again, or one older than what was merged
            self._last_seq[device_id] = message.seq
            for m in message.models:
                if m.inputs:
                    key = (m.model, m.version, device_id)
                    self._held.setdefault(key, _Held()).merge(m.inputs, self.settings.decay)
                    touched.add(key)
        now = time.monotonic()
        for key in touched:
            self._seen[key] = now
        if now - self._pruned_at > PRUNE_INTERVAL_S:
            self._forget(now - self.settings.forget_after_s)
            self._pruned_at = now
        versions = {(model, version) for model, version, _ in touched}
        for mv in versions:
            if now - self._fleet_at.get(mv, -1e18) >= self.settings.fleet_interval_s:
                self._fleet_at[mv] = now
                touched.add((*mv, FLEET))
        references = {mv: await self._reference(*mv) for mv in versions}
        judged = await asyncio.to_thread(self._judge_all, touched, references)
        if judged:
            await self._store(judged)

    def _judge_all(
        self,
        touched: set[tuple[str, int, str]],
        references: dict[tuple[str, int], _Reference | None],
    ) -> list[tuple[tuple[str, int, str], float, int, list[FeatureDrift]]]:
        out = []
        for key in sorted(touched):
            reference = references[key[:2]]
            if reference is None:
                continue
            held = self._fleet(*key[:2]) if key[2] == FLEET else self._held[key]
            if held.rows < self.settings.min_rows:
                continue
            drifts = self._judge(held, reference)
            if drifts:
                out.append((key, held.rows, held.windows, drifts))
        return out

    def _fleet(self, model: str, version: int) -> _Held:
        fleet = _Held()
        for (m, v, _), held in self._held.items():
            if (m, v) == (model, version):
                fleet.rows += held.rows
                fleet.windows += held.windows
                fleet.accuracy |= held.accuracy
                for k, f in held.features.items():
                    if held.accuracy[k[0]] == fleet.accuracy[k[0]]:
                        fleet.features.setdefault(k, _Feature()).add(f)
        return fleet

    def _judge(self, held: _Held, reference: _Reference) -> list[FeatureDrift]:
        drifts = []
        for (name, feature), f in sorted(held.features.items()):
            if name not in reference.inputs.inputs or not f.bins:
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
            sha = (
                await s.execute(
                    select(ModelVersion.reference)
                    .join(Model)
                    .where(Model.name == model, ModelVersion.version == version)
                )
            ).scalar_one_or_none()
        digest = sha.get("sha256") if isinstance(sha, dict) else None
        cached = self._references.get((model, version))
        if digest is None:
            return None
        if cached is None or cached.sha256 != digest:
            loaded = await asyncio.to_thread(load_reference, self.store.path(digest))
            cached = self._references[(model, version)] = _Reference(digest, loaded)
        return cached

    async def _store(
        self, judged: list[tuple[tuple[str, int, str], float, int, list[FeatureDrift]]]
    ) -> None:
        at = datetime.now(UTC)
        threshold = self.settings.psi_threshold
        async with self.sessions.begin() as s:
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
                self._alert(model, version, device_id, worst, windows, threshold)
        for (model, version, device_id), _, _, drifts in judged:
            worst_psi = max(d.psi for d in drifts)
            if device_id == FLEET:
                self.metrics.drift_psi.labels(model, str(version), FLEET).set(worst_psi)
            else:
                self._psi.setdefault((model, version), {})[device_id] = worst_psi
        for model, version in {(m, v) for (m, v, d), _, _, _ in judged if d != FLEET}:
            largest = max(self._psi[(model, version)].values())
            self.metrics.drift_psi.labels(model, str(version), "max").set(largest)

    def _forget(self, before: float) -> None:
        """Drop what is held of device versions not heard from since ``before``."""
        for key in [k for k, at in self._seen.items() if at < before]:
            del self._seen[key]
            self._held.pop(key, None)
            self._psi.get(key[:2], {}).pop(key[2], None)

    def _alert(
        self,
        model: str,
        version: int,
        device_id: str,
        worst: FeatureDrift,
        windows: int,
        threshold: float,
    ) -> None:
        key = (model, version, device_id)
        held = self._held.get(key) if device_id != FLEET else None
        over = worst.psi > threshold
        was = held.over if held is not None else self._fleet_over.get(key[:2], False)
        if held is not None:
            held.over = over
        else:
            self._fleet_over[key[:2]] = over
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
                    "windows": windows,
                },
            )
        elif was and not over:
            log.info(
                "input drift back under threshold",
                extra={"model": model, "version": version, "device_id": device_id},
            )
