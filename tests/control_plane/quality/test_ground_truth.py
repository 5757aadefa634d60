"""Ground truth with a real agent, broker and control plane: an app posts the true digits for
the agent's predictions, the control plane shows live accuracy, and when the labels flip it
falls, concept drift is alerted and a rollout gated on ``max_accuracy_drop`` pauses. Posted
outcomes survive an agent restart with the broker down."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.fleet.settings import FleetSettings
from control_plane.settings.ground_truth import GroundTruthSettings
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.control_plane.quality.conftest import edgefleet
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import Mosquitto, free_port

CONFIG = '[ground_truth]\ntask = "classification"\n'
THRESHOLD = 0.2
MIN_OUTCOMES = 50


@pytest.fixture(scope="module")
def cp(
    tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto
) -> Iterator[RunningControlPlane]:
    root = tmp_path_factory.mktemp("truth-cp")
    truth = GroundTruthSettings(
        concept_drift_threshold=THRESHOLD, min_outcomes=MIN_OUTCOMES, check_interval_s=0.2
    )
    db = f"sqlite+aiosqlite:///{root}/cp.db"
    with control_plane(root / "cp", db, broker.url, free_port(), ground_truth=truth) as running:
        yield running


@pytest.fixture(scope="module")
def digits(examples: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(examples / "digits/1/reference.npz") as data:
        return data["input:input"].astype(np.float32), data["labels"].astype(int)


def fleet_settings(
    broker: Mosquitto, cp: RunningControlPlane, state: Path, device: str
) -> FleetSettings:
    return FleetSettings(
        mqtt_url=broker.url,
        device_id=device,
        labels={"site": f"{device}-lab"},
        state_dir=state,
        trust_root_file=cp.trust_root_file,
        telemetry_interval_s=0.3,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )


def predict_and_post(
    agent: RunningAgent,
    data: tuple[np.ndarray, np.ndarray],
    requests: int,
    *,
    flip: bool,
    start: int = 0,
) -> int:
    """Send ``requests`` of 8 reference digits each and post their true labels (each plus one,
    mod 10, once ``flip``: the world no longer answers what the model learnt); rows posted."""
    x, y = data
    outcomes = []
    for i in range(requests):
        rows = (np.arange(8) + 8 * (start + i)) % len(x)
        answer = agent.infer_json("digits", x[rows])
        assert answer.status_code == 200, answer.text
        labels = (y[rows] + 1) % 10 if flip else y[rows]
        outcomes.append({"id": answer.json()["id"], "labels": labels.tolist()})
    posted = agent.client.post("/v2/models/digits/feedback", json={"outcomes": outcomes})
    assert posted.status_code == 200, posted.text
    assert posted.json()["joined"] == requests, posted.text
    return 8 * requests


def accuracy(cp: RunningControlPlane, version: int, **params: Any) -> dict[str, Any]:
    answer = cp.admin.get(f"/api/v1/models/digits/versions/{version}/accuracy", params=params)
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    return doc


def outcomes_of(cp: RunningControlPlane, version: int, device: str) -> int:
    rows = [d for d in accuracy(cp, version)["devices"] if d["device_id"] == device]
    return int(rows[0]["outcomes"]) if rows else 0


def push(
    cp: RunningControlPlane,
    examples: Path,
    tmp_path: Path,
    name: str,
    version: str,
    *,
    truth: str = CONFIG,
) -> None:
    config = tmp_path / "serving.toml"
    config.write_text(truth + "[health]\nwindow_s = 0.2\nmin_requests = 100000\n")
    version_dir = examples / "digits/1"
    pushed = edgefleet(
        cp,
        *("models", "push", name, version, str(version_dir), "--config", str(config)),
        *("--reference", str(version_dir / "reference.npz"), "--no-optimise"),
    )
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert edgefleet(cp, "models", "validate", name, version).returncode == 0


def rollout(cp: RunningControlPlane, rollout_id: int) -> dict[str, Any]:
    doc: dict[str, Any] = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
    return doc


def gate(cp: RunningControlPlane, rollout_id: int) -> dict[str, Any]:
    """The accuracy gate's report on the first wave ({} before it was judged)."""
    report: dict[str, Any] = rollout(cp, rollout_id)["gate_report"].get("0", {})
    return report.get("accuracy", {})


def test_flipped_labels_drop_live_accuracy_alert_and_pause_the_rollout(
    cp: RunningControlPlane,
    broker: Mosquitto,
    examples: Path,
    digits: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="edgefleet.control_plane.drift")
    for version in ("1", "2"):  # v1 is what the device serves from its own repository
        push(cp, examples, tmp_path, "digits", version)
    reference = cp.admin.get("/api/v1/models/digits/versions/2").json()["validation"]
    assert reference["reference_accuracy"] > 0.9, reference
    repo = copy_models(examples, tmp_path / "repo", "digits", configs={"digits": CONFIG})
    fleet = fleet_settings(broker, cp, tmp_path / "state", "truth-box")
    with serve(repo, fleet=fleet) as agent:
        wait_until(
            lambda: any(d["id"] == "truth-box" for d in cp.admin.get("/api/v1/devices").json()),
            timeout_s=60,
            what="the device in the inventory",
        )
        # 1. the baseline, v1 (served from the device's own repository), answers well
        sent = predict_and_post(agent, digits, 10, flip=False)
        wait_until(lambda: outcomes_of(cp, 1, "truth-box") == sent, what="v1's outcomes")
        baseline = accuracy(cp, 1)["fleet"]
        assert baseline["accuracy"] > 0.9, baseline

        # 2. v2 rolls out gated on live accuracy; its first outcomes are as good
        spec = {
            "model": "digits",
            "version": 2,
            "selector": {"site": "truth-box-lab"},
            "waves": ["100%"],
            "bake_time_s": 600,
            "device_timeout_s": 60,
            "gates": {
                "max_accuracy_drop": 0.1,
                "min_outcomes": MIN_OUTCOMES,
                "min_requests": 1,
                "max_p99_ratio": 1000,
            },
        }
        created = cp.admin.post("/api/v1/rollouts", json=spec)
        assert created.status_code == 201, created.text
        rollout_id = created.json()["id"]
        wait_until(
            lambda: rollout(cp, rollout_id)["waves"][0]["states"] == {"committed": 1},
            timeout_s=60,
            what="the device to commit v2",
        )
        sent = predict_and_post(agent, digits, 10, flip=False, start=10)
        wait_until(lambda: outcomes_of(cp, 2, "truth-box") == sent, what="v2's outcomes")
        before = accuracy(cp, 2)
        assert before["fleet"]["accuracy"] > 0.9 and not before["concept_drift"]["over_threshold"]
        wait_until(lambda: gate(cp, rollout_id).get("judged"), what="the gate to judge v2")
        assert rollout(cp, rollout_id)["state"] == "running"  # as good as v1: not paused

        # 3. the labels flip: v2's live accuracy falls, concept drift alerts, the rollout pauses
        sent += predict_and_post(agent, digits, 30, flip=True, start=20)
        wait_until(lambda: outcomes_of(cp, 2, "truth-box") == sent, what="the flipped outcomes")
        after = accuracy(cp, 2, group_by="site")
        assert after["fleet"]["accuracy"] < before["fleet"]["accuracy"] - 0.5, after["fleet"]
        assert after["groups"] == [{"value": "truth-box-lab", **after["fleet"]}]
        assert {row["label"] for row in after["labels"]} == set(range(10))
        drift = after["concept_drift"]
        assert drift["over_threshold"] and drift["drop"] > THRESHOLD, drift
        wait_until(lambda: rollout(cp, rollout_id)["state"] != "running", what="the accuracy gate")
        doc = rollout(cp, rollout_id)
        assert doc["state"] == "paused", doc["reason"]  # paused, not rolled back
        assert doc["reason"].startswith("live accuracy: v2 "), doc["reason"]
        assert "max_accuracy_drop 0.1" in doc["reason"]
        report = doc["gate_report"]["0"]["accuracy"]
        assert report["paused"] and report["baseline_version"] == 1, report
        wait_until(
            lambda: any(
                r.getMessage() == "concept drift over threshold" and r.__dict__["version"] == 2
                for r in caplog.records
            ),
            what="the concept drift alert",
        )
        metrics = cp.admin.get("/metrics").text
        assert 'edgefleet_concept_drift_alerts_total{model="digits",version="2"} 1.0' in metrics
        shown = edgefleet(cp, "models", "accuracy", "digits", "2", "--group-by", "site")
        assert shown.returncode == 0, shown.stderr
        assert "concept drift: OVER" in shown.stdout and "truth-box-lab" in shown.stdout
        status = edgefleet(cp, "rollouts", "status", str(rollout_id))
        assert "live accuracy" in status.stdout, status.stdout


def test_outcomes_survive_an_agent_restart_with_the_broker_down(
    cp: RunningControlPlane,
    broker: Mosquitto,
    examples: Path,
    digits: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
) -> None:
    repo = copy_models(examples, tmp_path / "repo", "digits", configs={"digits": CONFIG})
    fleet = fleet_settings(broker, cp, tmp_path / "state", "restart-box")
    with serve(repo, fleet=fleet) as agent:
        wait_until(
            lambda: any(d["id"] == "restart-box" for d in cp.admin.get("/api/v1/devices").json()),
            timeout_s=60,
            what="the device in the inventory",
        )
        first = predict_and_post(agent, digits, 3, flip=False)
        wait_until(lambda: outcomes_of(cp, 1, "restart-box") == first, what="the first outcomes")
        broker.stop()
        try:
            # posted and answered while the broker is down; the agent stops at once after,
            # with them in its journal or (a window later) its outbox
            posted = predict_and_post(agent, digits, 5, flip=False)
        except BaseException:
            broker.start()
            raise
    try:
        with serve(repo, fleet=fleet) as agent:  # restarted, still offline: a window moves them
            client = agent.state.fleet
            assert client is not None
            wait_until(lambda: client.outcomes.take() == {}, what="the journal to drain")
            assert not client.connected.is_set()
        assert outcomes_of(cp, 1, "restart-box") == first
    finally:
        broker.start()
    with serve(repo, fleet=fleet):  # restarted again, the broker back
        wait_until(
            lambda: outcomes_of(cp, 1, "restart-box") == first + posted,
            timeout_s=60,
            what="the outcomes posted while the broker was down",
        )
        # sent once: a count past first + posted would show a duplicate
        assert outcomes_of(cp, 1, "restart-box") == first + posted


def test_gates_that_cannot_judge_are_refused_and_too_few_outcomes_wait(
    cp: RunningControlPlane,
    broker: Mosquitto,
    examples: Path,
    tmp_path: Path,
) -> None:
    for version in ("1", "2"):  # pushed by the first test, unless it did not run
        if cp.admin.get(f"/api/v1/models/digits/versions/{version}").status_code == 404:
            push(cp, examples, tmp_path, "digits", version)
    push(cp, examples, tmp_path, "digits", "3", truth="")  # keeps no predictions
    push(cp, examples, tmp_path, "digits-b", "1")  # served nowhere yet
    repo = copy_models(examples, tmp_path / "repo", "digits", configs={"digits": CONFIG})
    with serve(repo, fleet=fleet_settings(broker, cp, tmp_path / "state", "wait-box")):
        wait_until(
            lambda: any(d["id"] == "wait-box" for d in cp.admin.get("/api/v1/devices").json()),
            timeout_s=60,
            what="the device in the inventory",
        )
        base = {"selector": {"site": "wait-box-lab"}, "waves": ["100%"], "bake_time_s": 0.2}
        gates = {"max_accuracy_drop": 0.1, "min_requests": 0}
        refused = [
            ("digits", 3, "gates.max_accuracy_drop: digits v3 sets no [ground_truth] task"),
            ("digits-b", 1, "gates.max_accuracy_drop: no targeted device serves another"),
        ]
        for model, version, why in refused:
            spec = {"model": model, "version": version, "gates": gates, **base}
            answer = cp.admin.post("/api/v1/rollouts", json=spec)
            assert answer.status_code == 400, answer.text
            assert why in answer.json()["error"], answer.text
        # a deployment's guard: refused at create and at a change, as a rollout is
        guarded = {"name": "guarded", "model": "digits", "selector": {"site": "none"}}
        answer = cp.admin.post(
            "/api/v1/deployments", json={**guarded, "version": 3, "gates": gates}
        )
        assert answer.status_code == 400, answer.text
        assert refused[0][2] in answer.json()["error"], answer.text
        answer = cp.admin.post(
            "/api/v1/deployments", json={**guarded, "version": 2, "gates": gates}
        )
        assert answer.status_code == 201, answer.text
        answer = cp.admin.patch("/api/v1/deployments/guarded", json={"version": 3})
        assert answer.status_code == 400 and refused[0][2] in answer.json()["error"], answer.text
        assert cp.admin.delete("/api/v1/deployments/guarded").status_code in (200, 204)
        spec = {"model": "digits", "version": 2, "gates": gates, **base}
        created = cp.admin.post("/api/v1/rollouts", json=spec)
        assert created.status_code == 201, created.text
        rollout_id = created.json()["id"]
        # baked, and no outcome came: the wave waits rather than pass unjudged
        wait_until(
            lambda: rollout(cp, rollout_id)["gate_report"].get("0", {}).get("waiting_for_outcomes"),
            timeout_s=60,
            what="the wave to wait for outcomes",
        )
        doc = rollout(cp, rollout_id)
        assert doc["state"] == "running", doc["reason"]
        report = doc["gate_report"]["0"]["accuracy"]
        assert not report["judged"] and report["new"]["outcomes"] == 0, report
        assert cp.admin.post(f"/api/v1/rollouts/{rollout_id}/cancel").status_code == 200
