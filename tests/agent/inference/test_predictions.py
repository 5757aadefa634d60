"""The prediction store on its own, with a clock of the test's: what is kept, what expires,
and the sums an outcome adds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.errors import StorageError
from agent.fleet.ground_truth import OutcomeJournal, attach
from agent.inference.predictions import GroundTruthSettings, OutcomeSums, PredictionStore
from common.protocol.ground_truth import MAX_GROUPS, REGRESSION_GROUP, GroundTruthTask
from common.protocol.messages import ModelTelemetry

CLASSIFY, REGRESS = GroundTruthTask.CLASSIFICATION, GroundTruthTask.REGRESSION


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def store(**settings: float) -> tuple[PredictionStore, Clock, list[OutcomeSums]]:
    clock = Clock()
    s = PredictionStore(GroundTruthSettings(**settings), clock=clock)  # type: ignore[arg-type]
    posted: list[OutcomeSums] = []
    s.sink = posted.append
    return s, clock, posted


def test_classification_sums_per_true_label() -> None:
    s, _, posted = store()
    logits = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.0, 0.2, 0.7]], dtype=np.float32)
    s.record("r1", "m", 2, CLASSIFY, logits)  # predicted 1, 0, 2
    result = s.join("m", [("r1", [1.0, 2.0, 2.0])])
    assert (result.joined, result.unknown) == (1, 0)
    (sums,) = posted
    by_label = {k[3]: (v.outcomes, v.correct) for k, v in sums.groups.items()}
    assert by_label == {1: (1, 1), 2: (2, 1)}
    assert all(k[:3] == ("m", 2, CLASSIFY) for k in sums.groups)


def test_regression_sums_absolute_and_squared_error() -> None:
    s, _, posted = store()
    s.record("r", "m", 1, REGRESS, np.array([[2.0], [5.0]], dtype=np.float32))
    s.join("m", [("r", [1.0, 8.0])])
    ((key, sums),) = posted[0].groups.items()
    assert key == ("m", 1, REGRESS, REGRESSION_GROUP)
    assert (sums.outcomes, sums.abs_error_sum, sums.squared_error_sum) == (2, 4.0, 10.0)


def test_expired_unknown_and_another_models_outcomes() -> None:
    s, clock, posted = store(prediction_max_age_s=60)
    s.record("old", "m", 1, CLASSIFY, np.eye(3, dtype=np.float32)[:1])
    clock.now += 30
    s.record("young", "m", 1, CLASSIFY, np.eye(3, dtype=np.float32)[:1])
    clock.now += 31
    result = s.join("other", [("young", [0.0])])
    assert result.mismatched == 1  # kept for its own model's outcome
    result = s.join("m", [("old", [0.0]), ("young", [0.0]), ("gone", [0.0])])
    assert (result.expired, result.joined, result.unknown) == (1, 1, 1)
    assert len(s) == 0 and len(posted) == 1


def test_the_oldest_go_past_max_predictions_and_non_numbers_are_not_kept() -> None:
    s, _, _ = store(max_predictions=2)
    for i in range(3):
        s.record(f"r{i}", "m", 1, CLASSIFY, np.ones((1, 2), dtype=np.float32))
    s.record("text", "m", 1, CLASSIFY, np.array([b"a"], dtype=object))
    s.record("inf", "m", 1, REGRESS, np.array([[np.inf]], dtype=np.float32))
    assert len(s) == 2
    assert s.join("m", [("r0", [0.0])]).unknown == 1
    assert s.join("m", [("r2", [0.0])]).joined == 1


def test_the_journal_keeps_sums_across_a_reopen_until_sent(tmp_path: Path) -> None:
    s, _, _ = store()
    path = tmp_path / "gt.sqlite3"
    journal = OutcomeJournal(path)
    s.sink = journal.add
    for i in range(4):
        s.record(f"r{i}", "m", 3, CLASSIFY, np.array([[0.0, 1.0]], dtype=np.float32))
    s.join("m", [("r0", [1.0]), ("r1", [0.0])])
    journal.close()
    journal = OutcomeJournal(path)  # a restart
    taken = journal.take()
    report = taken[("m", 3)]
    assert [(g.label, g.outcomes, g.correct) for g in report.groups] == [(0, 1, 0), (1, 1, 1)]
    s.sink = journal.add
    s.join("m", [("r2", [1.0])])  # arrives between the window's take and its write
    journal.sent(taken)
    left = journal.take()[("m", 3)]
    assert [(g.label, g.outcomes, g.correct) for g in left.groups] == [(1, 1, 1)]
    journal.sent(journal.take())
    assert journal.take() == {}


def test_attach_adds_an_entry_for_a_version_no_longer_served(tmp_path: Path) -> None:
    journal = OutcomeJournal(tmp_path / "gt.sqlite3")
    s, _, _ = store()
    s.sink = journal.add
    for version in (1, 2):
        s.record(f"v{version}", "m", version, CLASSIFY, np.array([[1.0, 0.0]], np.float32))
        s.join("m", [(f"v{version}", [0.0])])
    served = ModelTelemetry(model="m", version=2, requests=5, errors=0, rows=5, batches=5)
    models = attach([served], journal.take())
    assert [(m.version, m.requests, m.ground_truth is not None) for m in models] == [
        (2, 5, True),
        (1, 0, True),
    ]


def test_a_window_takes_at_most_max_groups_labels_the_rest_wait(tmp_path: Path) -> None:
    journal = OutcomeJournal(tmp_path / "gt.sqlite3")
    s, _, _ = store()
    s.sink = journal.add
    extra = 5
    for label in range(MAX_GROUPS + extra):
        s.record(f"r{label}", "m", 1, CLASSIFY, np.array([[1.0, 0.0]], np.float32))
        s.join("m", [(f"r{label}", [float(label)])])
    first = journal.take()
    assert len(first[("m", 1)].groups) == MAX_GROUPS  # a valid report: within the wire's bound
    journal.sent(first)
    assert [g.label for g in journal.take()[("m", 1)].groups] == list(
        range(MAX_GROUPS, MAX_GROUPS + extra)
    )


def test_a_sink_that_cannot_store_leaves_the_predictions_for_a_retry() -> None:
    s, _, posted = store()

    def full_disk(sums: OutcomeSums) -> None:
        raise StorageError("outcomes cannot be stored on this device: disk I/O error")

    s.record("r", "m", 1, CLASSIFY, np.array([[0.0, 1.0]], np.float32))
    s.sink = full_disk
    with pytest.raises(StorageError):
        s.join("m", [("r", [1.0])])
    s.sink = posted.append
    assert s.join("m", [("r", [1.0]), ("r", [1.0])]).joined == 1  # and once per post
    assert len(posted) == 1 and len(s) == 0
