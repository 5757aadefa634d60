"""Live accuracy: the outcomes apps posted for devices' predictions, summed.

Devices send per telemetry window and true label how many of a version's kept predictions got
an outcome, how many were right (classification) and their error sums (regression); stored
as they come (``ground_truth``, one row per window and label). Read back here as accuracy (or
mean absolute error) per version over a span of the control plane's clock: for the fleet,
per device, per true label, per value of a device label, and per time bucket; and against
the version's reference accuracy (what it scored on its labelled reference or validation set
at validation), which is concept drift: the world's answers moved away from what the model
learnt.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from common.protocol.ground_truth import REGRESSION_GROUP, GroundTruthTask
from control_plane.db.models import Device, GroundTruthRecord, ModelVersion
from control_plane.db.session import stored_utc

CHUNK = 1000
"""Device ids in one ``IN`` list (SQLite's bound parameters and PostgreSQL's plans)."""


@dataclass
class Live:
    """Outcomes summed over some windows."""

    task: str | None = None
    outcomes: int = 0
    correct: int = 0
    abs_error_sum: float = 0.0
    squared_error_sum: float = 0.0

    def add(self, task: str, n: int, correct: int, abs_sum: float, sq_sum: float) -> None:
        self.task = self.task or task
        self.outcomes += int(n)
        self.correct += int(correct)
        self.abs_error_sum += float(abs_sum)
        self.squared_error_sum += float(sq_sum)

    @property
    def regression(self) -> bool:
        return self.task == GroundTruthTask.REGRESSION

    @property
    def accuracy(self) -> float | None:
        if not self.outcomes or self.regression:
            return None
        return self.correct / self.outcomes

    @property
    def mean_abs_error(self) -> float | None:
        return self.abs_error_sum / self.outcomes if self.outcomes and self.regression else None

    def doc(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcomes": self.outcomes}
        if self.regression:
            out["mean_abs_error"] = self.mean_abs_error
            out["rmse"] = (self.squared_error_sum / self.outcomes) ** 0.5 if self.outcomes else None
        else:
            out |= {"correct": self.correct, "accuracy": self.accuracy}
        return out


async def live_sums(
    session: AsyncSession,
    model: str,
    version: int,
    since: datetime,
    until: datetime,
    device_ids: list[str] | None = None,
) -> Live:
    """A version's outcomes received from ``since`` to ``until`` (the control plane's clock),
    on ``device_ids`` (None: every device)."""
    g = GroundTruthRecord
    live = Live()
    chunks = (
        [None]
        if device_ids is None
        else [device_ids[i : i + CHUNK] for i in range(0, len(device_ids), CHUNK)]
    )
    for chunk in chunks:
        query = select(
            g.task,
            func.sum(g.outcomes),
            func.sum(g.correct),
            func.sum(g.abs_error_sum),
            func.sum(g.squared_error_sum),
        ).where(
            g.model == model,
            g.version == version,
            g.received_at >= since,
            g.received_at <= until,
        )
        if chunk is not None:
            query = query.where(g.device_id.in_(chunk))
        for task, n, correct, abs_sum, sq_sum in await session.execute(query.group_by(g.task)):
            live.add(task, n, correct, abs_sum, sq_sum)
    return live


def reference_accuracy(mv: ModelVersion) -> float | None:
    """What the version scored on its labelled reference set (or validation set) when it was
    validated; None without labels or a validation."""
    report = mv.validation or {}
    value = report.get("reference_accuracy")
    if value is None:
        value = report.get("accuracy")
    return None if value is None else float(value)


def concept_drift(
    live: Live, reference: float | None, threshold: float, min_outcomes: int
) -> dict[str, Any]:
    """Live accuracy against the reference's: the drop, and whether it is past ``threshold``
    (judged from ``min_outcomes`` outcomes on)."""
    doc: dict[str, Any] = {
        "reference_accuracy": reference,
        "threshold": threshold,
        "min_outcomes": min_outcomes,
    }
    accuracy = live.accuracy
    if reference is None or accuracy is None:
        doc["note"] = "no reference accuracy" if reference is None else "no outcomes"
        return doc | {"drop": None, "over_threshold": False}
    if live.outcomes < min_outcomes:
        doc["note"] = f"fewer than {min_outcomes} outcomes: not judged yet"
        return doc | {"drop": reference - accuracy, "over_threshold": False}
    return doc | {"drop": reference - accuracy, "over_threshold": reference - accuracy > threshold}


async def accuracy_report(
    session: AsyncSession,
    mv: ModelVersion,
    model: str,
    since: datetime,
    until: datetime,
    *,
    bucket_s: float,
    group_by: str | None,
) -> dict[str, Any]:
    """Live accuracy of ``mv`` over a span: for the fleet, per device, per true label, per
    value of the device label ``group_by`` and per ``bucket_s`` of reception time."""
    g = GroundTruthRecord
    rows = (
        await session.execute(
            select(
                g.device_id,
                g.received_at,
                g.label,
                g.task,
                g.outcomes,
                g.correct,
                g.abs_error_sum,
                g.squared_error_sum,
            ).where(
                g.model == model,
                g.version == mv.version,
                g.received_at >= since,
                g.received_at <= until,
            )
        )
    ).all()
    fleet = Live()
    devices: dict[str, Live] = {}
    labels: dict[int, Live] = {}
    buckets: dict[int, Live] = {}
    start = stored_utc(since)
    for device_id, received, label, task, n, correct, abs_sum, sq_sum in rows:
        index = int(stored_utc(received).timestamp() // bucket_s)  # aligned to the epoch
        targets = [fleet, devices.setdefault(device_id, Live())]
        targets.append(buckets.setdefault(index, Live()))
        if label != REGRESSION_GROUP:
            targets.append(labels.setdefault(label, Live()))
        for live in targets:
            live.add(task, n, correct, abs_sum, sq_sum)
    doc: dict[str, Any] = {
        "model": model,
        "version": mv.version,
        "since": start.isoformat(),
        "until": stored_utc(until).isoformat(),
        "task": fleet.task,
        "fleet": fleet.doc(),
        "devices": [{"device_id": d, **live.doc()} for d, live in sorted(devices.items())],
        "labels": [{"label": k, **live.doc()} for k, live in sorted(labels.items())],
        "buckets": [
            {"start": datetime.fromtimestamp(i * bucket_s, UTC).isoformat(), **live.doc()}
            for i, live in sorted(buckets.items())
        ],
    }
    if group_by is not None:
        doc["group_by"] = group_by
        doc["groups"] = await _groups(session, devices, group_by)
    return doc


async def _groups(
    session: AsyncSession, devices: dict[str, Live], key: str
) -> list[dict[str, Any]]:
    """The devices' sums per value of their label ``key`` (operator labels win over
    reported ones, as selectors match them); devices without it under None."""
    values: dict[str, str | None] = {}
    ids = list(devices)
    for start in range(0, len(ids), CHUNK):
        found = await session.execute(
            select(Device.id, Device.reported_labels, Device.operator_labels).where(
                Device.id.in_(ids[start : start + CHUNK])
            )
        )
        for device_id, reported, operator in found:
            values[device_id] = {**(reported or {}), **(operator or {})}.get(key)
    grouped: dict[str | None, Live] = {}
    for device_id, live in devices.items():
        target = grouped.setdefault(values.get(device_id), Live())
        if live.task is not None:
            target.add(
                live.task, live.outcomes, live.correct, live.abs_error_sum, live.squared_error_sum
            )
    return [{"value": v, **live.doc()} for v, live in sorted(grouped.items(), key=_none_last)]


def _none_last(item: tuple[str | None, Live]) -> tuple[bool, str]:
    return (item[0] is None, item[0] or "")
