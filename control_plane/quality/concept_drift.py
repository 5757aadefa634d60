"""Concept drift: each version's live accuracy over the fleet against its reference accuracy.

Every ``check_interval_s`` the monitor reads, for each version whose outcomes came in since
the last check (ingest tells it, :meth:`ConceptDriftMonitor.offer`), and each one over the
threshold at the last, the fleet's live accuracy over the last ``window_s``
(:mod:`.accuracy`), sets
``edgefleet_live_accuracy``, and when it falls more than ``concept_drift_threshold`` below the
version's reference accuracy logs ``concept drift over threshold`` (a warning, once per
crossing) and counts ``edgefleet_concept_drift_alerts``. Back under the threshold, the next
crossing alerts again. Regressions have no accuracy: their error shows in the API only.

Each replica judges on its own (the alert is a log line and a counter of that replica's):
what they read is the same database.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from common.protocol.messages import Telemetry
from control_plane.db.models import Model, ModelVersion
from control_plane.metrics import FleetMetrics
from control_plane.quality.accuracy import concept_drift, live_sums, reference_accuracy
from control_plane.settings.ground_truth import GroundTruthSettings

log = logging.getLogger("edgefleet.control_plane.drift")


class ConceptDriftMonitor:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        metrics: FleetMetrics,
        settings: GroundTruthSettings,
    ) -> None:
        self.sessions = sessions
        self.metrics = metrics
        self.settings = settings
        self._over: set[tuple[str, int]] = set()
        """Versions whose last judgement was over the threshold (alerted once)."""
        self._heard: set[tuple[str, int]] = set()
        """Versions with outcomes queued for storing since the last check."""
        self._before: set[tuple[str, int]] = set()
        """Those heard between the two checks before (judged once more)."""

    def offer(self, device_id: str, message: Telemetry) -> None:
        """A telemetry message queued for storing (ingest's hook; must not wait)."""
        for m in message.models:
            if m.ground_truth is not None:
                self._heard.add((m.model, m.version))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.check_interval_s)
            try:
                await self.check(datetime.now(UTC))
            except Exception:  # one failed round must not end concept drift for good
                log.exception("concept drift not judged")

    async def check(self, now: datetime) -> list[tuple[str, int]]:
        """Judge the versions heard since the last check and those over the threshold; the
        versions that alerted now."""
        since = now - timedelta(seconds=self.settings.window_s)
        alerted = []
        # heard since the last check, and before it: a batch still being written at the last
        # check is stored by now; over the threshold: judged until they come back under it
        heard, self._heard = self._heard, set()
        judged = heard | self._before | self._over
        self._before = heard
        async with self.sessions() as s:
            for model, version in sorted(judged):
                mv = (
                    await s.execute(
                        select(ModelVersion)
                        .join(Model, Model.id == ModelVersion.model_id)
                        .where(Model.name == model, ModelVersion.version == version)
                    )
                ).scalar_one_or_none()
                if mv is None:  # outcomes of a version deleted since
                    continue
                live = await live_sums(s, model, version, since, now)
                if live.accuracy is None:
                    continue
                self.metrics.live_accuracy.labels(model, str(version)).set(live.accuracy)
                verdict = concept_drift(
                    live,
                    reference_accuracy(mv),
                    self.settings.concept_drift_threshold,
                    self.settings.min_outcomes,
                )
                key = (model, version)
                if not verdict["over_threshold"]:
                    self._over.discard(key)
                    continue
                if key in self._over:
                    continue
                self._over.add(key)
                alerted.append(key)
                self.metrics.concept_drift_alerts.labels(model, str(version)).inc()
                log.warning(
                    "concept drift over threshold",
                    extra={
                        "model": model,
                        "version": version,
                        "accuracy": live.accuracy,
                        "reference_accuracy": verdict["reference_accuracy"],
                        "drop": verdict["drop"],
                        "outcomes": live.outcomes,
                    },
                )
        return alerted
