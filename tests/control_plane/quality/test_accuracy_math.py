"""Live accuracy's sums on their own: what a reader and the gate make of them."""

from __future__ import annotations

from control_plane.quality.accuracy import Live, concept_drift
from control_plane.rollouts.accuracy_gate import accuracy_verdict


def live(task: str, n: int, correct: int = 0, abs_sum: float = 0.0, sq: float = 0.0) -> Live:
    out = Live()
    out.add(task, n, correct, abs_sum, sq)
    return out


def test_classification_and_regression_documents() -> None:
    assert live("classification", 8, 6).doc() == {"outcomes": 8, "correct": 6, "accuracy": 0.75}
    assert live("regression", 4, 0, 8.0, 36.0).doc() == {
        "outcomes": 4,
        "mean_abs_error": 2.0,
        "rmse": 3.0,
    }
    assert Live().doc() == {"outcomes": 0, "correct": 0, "accuracy": None}


def test_concept_drift_needs_a_reference_and_enough_outcomes() -> None:
    assert concept_drift(live("classification", 10, 1), None, 0.1, 5)["note"] == (
        "no reference accuracy"
    )
    few = concept_drift(live("classification", 10, 1), 0.9, 0.1, 50)
    assert not few["over_threshold"] and few["note"].startswith("fewer than 50")
    over = concept_drift(live("classification", 100, 70), 0.9, 0.1, 50)
    assert over["over_threshold"] and round(over["drop"], 6) == 0.2
    assert not concept_drift(live("classification", 100, 85), 0.9, 0.1, 50)["over_threshold"]


def test_the_gate_on_accuracy_and_on_a_regressions_error() -> None:
    base = live("classification", 100, 90)
    assert accuracy_verdict(live("classification", 100, 85), base, 0.1, 2, 1) is None
    why = accuracy_verdict(live("classification", 100, 70), base, 0.1, 2, 1)
    assert why is not None and why.startswith("live accuracy: v2 0.700 over 100 outcomes")
    base = live("regression", 10, 0, 10.0)  # MAE 1.0
    assert accuracy_verdict(live("regression", 10, 0, 10.5), base, 0.1, 2, 1) is None
    why = accuracy_verdict(live("regression", 10, 0, 12.0), base, 0.1, 2, 1)
    assert why is not None and "20.0% above v1's 1" in why
    # one side a classification, the other a regression: nothing comparable, no verdict
    assert accuracy_verdict(live("classification", 10, 1), base, 0.1, 2, 1) is None
