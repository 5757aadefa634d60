"""The text of ``edgefleet rollouts status``: device phases, the bake's countdown and the gates'
verdict in words (the captured output in docs/control-plane.md comes from a real rollout)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from control_plane.status_view import gate_words, phase_words, status_lines

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
GATES = {"min_requests": 20, "max_error_rate": 0.01, "max_p99_ratio": 2.0}


def rollout(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": 7,
        "model": "mlp",
        "version": 2,
        "state": "running",
        "reason": "",
        "current_wave": 0,
        "bake_started_at": None,
        "bake_time_s": 60.0,
        "gates": GATES,
        "gate_report": {},
        "waves": [{"wave": 0, "size": "1", "devices": 1, "states": {"sent": 1}}],
        "devices": [{"device_id": "dev-a", "wave": 0, "state": "sent", "reason": ""}],
    }
    return doc | overrides


def device(phase: dict[str, Any] | None, state: str = "sent", reason: str = "") -> dict[str, Any]:
    return {"device_id": "dev-a", "wave": 0, "state": state, "reason": reason, "phase": phase}


def test_a_device_in_flight_shows_the_phase_it_reported() -> None:
    downloading = {"state": "downloading", "bytes_done": 1_200_000, "bytes_total": 2_600_000}
    assert phase_words(device(downloading)) == "downloading 46% (1.2 MB of 2.6 MB)"
    active = {"state": "active", "window_s": 30.0, "window_left_s": 12.4}
    assert phase_words(device(active)) == "health window, 12 s of 30 left"
    assert phase_words(device({"state": "staged"})) == "staged"
    retrying = {"state": "downloading", "code": "disk_full", "reason": "disk_full: no space"}
    assert phase_words(device(retrying)) == "downloading (disk_full: no space)"
    assert phase_words(device(None)) == "sent"


def test_an_outcome_reads_as_the_rows_state_with_its_reason() -> None:
    why = "health_check_failed: error rate 40.0% over 25 requests exceeds 1.0%"
    rolled_back = device({"state": "rolled_back", "reason": why}, "rolled_back", why)
    assert phase_words(rolled_back) == f"rolled back ({why})"
    assert phase_words(device({"state": "committed"}, "committed")) == "committed"


def test_the_gates_say_when_they_did_not_judge_and_otherwise_how_they_judged() -> None:
    assert gate_words(rollout()) is None
    unjudged = {"0": {"requests": 3, "errors": 0, "p99_ms": None, "note": "fewer than 20"}}
    assert gate_words(rollout(gate_report=unjudged)) == (
        "gates not judged: 3 requests < minimum 20"
    )
    judged = {"0": {"requests": 812, "errors": 3, "error_rate": 0.0037, "p99_ratio": 1.1}}
    assert gate_words(rollout(gate_report=judged)) == (
        "gates: error rate 0.4% (limit 1.0%) over 812 requests, p99 1.10x (limit 2x)"
    )


def test_the_current_wave_shows_its_bake_countdown_gates_and_devices() -> None:
    doc = rollout(
        bake_started_at=(NOW - timedelta(seconds=15)).isoformat(),
        gate_report={"0": {"requests": 0, "errors": 0, "p99_ms": None, "note": "fewer"}},
        waves=[
            {"wave": 0, "size": "1", "devices": 1, "states": {"committed": 1}},
            {"wave": 1, "size": "100%", "devices": 1, "states": {"pending": 1}},
        ],
        devices=[
            device({"state": "committed"}, "committed"),
            {"device_id": "dev-b", "wave": 1, "state": "pending", "reason": "", "phase": None},
        ],
    )
    assert status_lines(doc, NOW) == [
        "rollout 7: mlp v2 running",
        " > wave 0 (1): 1 devices  committed=1",
        "     baking, 45 s of 60 left",
        "     gates not judged: 0 requests < minimum 20",
        "       dev-a: committed",
        "   wave 1 (100%): 1 devices  pending=1",
    ]
