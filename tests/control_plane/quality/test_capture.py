"""Data capture with a real agent, broker and control plane: a model's ``[capture]`` policy
stores samples on the device, they upload through the telemetry topic and ``edgefleet data
export`` writes files whose tensors are what the app sent and got back; with the broker down
they wait in the spool across an agent restart and arrive once; the low-confidence trigger
keeps only the low rows; a model without a policy captures nothing; the device view shows
the policy and counts; and an export lands in a real MLflow run's artifacts."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.fleet.settings import FleetSettings
from runtimes.examples.weights import MLP_SIZES
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.control_plane.quality.conftest import edgefleet
from tests.control_plane.server import RunningControlPlane
from tests.mqtt_broker import Mosquitto

MLP_IN = MLP_SIZES[0]
EVERY = "[capture]\nenabled = true\nsample_rate = 1.0\nmax_samples_per_minute = 1000\n"


@pytest.fixture(scope="module")
def digits(examples: Path) -> np.ndarray:
    with np.load(examples / "digits/1/reference.npz") as data:
        x: np.ndarray = data["input:input"].astype(np.float32)
    return x


def fleet_settings(
    broker: Mosquitto, cp: RunningControlPlane, state: Path, device: str
) -> FleetSettings:
    return FleetSettings(
        mqtt_url=broker.url,
        device_id=device,
        state_dir=state,
        trust_root_file=cp.trust_root_file,
        telemetry_interval_s=0.3,
        telemetry_resend_s=1.0,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )


def samples(cp: RunningControlPlane, device: str, model: str = "digits") -> list[dict[str, Any]]:
    answer = cp.admin.get(f"/api/v1/models/{model}/versions/1/samples", params={"limit": 1000})
    assert answer.status_code == 200, answer.text
    return [s for s in answer.json()["samples"] if s["device_id"] == device]


def in_inventory(cp: RunningControlPlane, device: str) -> None:
    wait_until(
        lambda: any(d["id"] == device for d in cp.admin.get("/api/v1/devices").json()),
        timeout_s=30,
        what="the device in the inventory",
    )


def send(agent: RunningAgent, x: np.ndarray) -> np.ndarray:
    answer = agent.infer_json("digits", x)
    assert answer.status_code == 200, answer.text
    out = answer.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def test_samples_are_stored_uploaded_and_exported_as_sent(
    cp: RunningControlPlane,
    broker: Mosquitto,
    digits: np.ndarray,
    examples: Path,
    tmp_path: Path,
) -> None:
    repo = copy_models(examples, tmp_path / "repo", "digits", configs={"digits": EVERY})
    sent = [digits[i : i + 2] for i in range(0, 10, 2)]
    with serve(repo, fleet=fleet_settings(broker, cp, tmp_path / "state", "cap-box")) as agent:
        in_inventory(cp, "cap-box")
        answers = [send(agent, x) for x in sent]
        wait_until(lambda: len(samples(cp, "cap-box")) == 5, what="the samples uploaded")
        wait_until(
            lambda: "uploaded 5" in edgefleet(cp, "devices", "show", "cap-box").stdout,
            what="the device view to show the uploads",
        )
    shown = edgefleet(cp, "devices", "show", "cap-box").stdout
    assert "capture        digits v1: on (sample_rate 1); captured 5 (sampled 5)" in shown, shown
    detail = cp.admin.get("/api/v1/devices/cap-box").json()
    capture = detail["models"][0]["capture"]
    assert capture["enabled"] and capture["uploaded"] == 5 and capture["spooled"] == 0, capture

    listed = edgefleet(cp, "data", "list", "digits", "--version", "1")
    assert listed.returncode == 0 and listed.stdout.count("cap-box") == 5, listed.stderr
    out = tmp_path / "export"
    exported = edgefleet(cp, "data", "export", "digits", "--version", "1", "--to", str(out))
    assert exported.returncode == 0, exported.stderr
    index = [e for e in json.loads((out / "index.json").read_text()) if e["device_id"] == "cap-box"]
    assert [e["trigger"] for e in index] == ["sampled"] * 5
    for entry, x, y in zip(index, sent, answers, strict=True):  # oldest first: as sent
        with np.load(out / entry["file"], allow_pickle=False) as archive:
            np.testing.assert_array_equal(archive["input:input"], x)
            np.testing.assert_array_equal(archive["output:logits"], y)


def test_samples_wait_out_the_broker_across_a_restart_and_arrive_once(
    cp: RunningControlPlane,
    broker: Mosquitto,
    digits: np.ndarray,
    examples: Path,
    tmp_path: Path,
) -> None:
    repo = copy_models(examples, tmp_path / "repo", "digits", configs={"digits": EVERY})
    fleet = fleet_settings(broker, cp, tmp_path / "state", "cap-restart")
    with serve(repo, fleet=fleet) as agent:
        in_inventory(cp, "cap-restart")
        send(agent, digits[:1])
        wait_until(lambda: len(samples(cp, "cap-restart")) == 1, what="the first sample")
        first = agent.state.fleet
        assert first is not None and first.capture is not None
        spooled = first.capture.tap.spool
        # stored is not yet acknowledged: its ack must be back before the broker goes
        wait_until(lambda: spooled.pending() == {}, what="the first sample acknowledged")
        broker.stop()
        try:
            for i in range(1, 7):
                send(agent, digits[i : i + 1])
            client = agent.state.fleet
            assert client is not None and client.capture is not None
            tap = client.capture.tap
            wait_until(lambda: tap.spool.pending().get("digits", (0, 0))[0] == 6, what="spooled")
        except BaseException:
            broker.start()
            raise
    try:
        with serve(repo, fleet=fleet) as agent:  # restarted, still offline: still spooled
            client = agent.state.fleet
            assert client is not None and client.capture is not None
            assert client.capture.tap.spool.pending()["digits"][0] == 6
            assert not client.connected.is_set()
        assert len(samples(cp, "cap-restart")) == 1
    finally:
        broker.start()
    with serve(repo, fleet=fleet) as agent:  # the broker back: they arrive
        wait_until(lambda: len(samples(cp, "cap-restart")) == 7, timeout_s=30, what="uploads")
        client = agent.state.fleet
        assert client is not None and client.capture is not None
        spool = client.capture.tap.spool
        wait_until(lambda: spool.pending() == {}, what="the spool to empty once acknowledged")
    stored = samples(cp, "cap-restart")
    assert len({s["sample_id"] for s in stored}) == len(stored) == 7  # once each
    firsts = sorted(digits[i : i + 1].tobytes() for i in range(7))
    got = []
    for s in stored:
        data = cp.admin.get(f"/api/v1/models/digits/versions/1/samples/{s['id']}/data").content
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            got.append(archive["input:input"].tobytes())
    assert sorted(got) == firsts


def test_low_confidence_captures_only_low_rows_and_no_policy_captures_nothing(
    cp: RunningControlPlane,
    broker: Mosquitto,
    digits: np.ndarray,
    examples: Path,
    tmp_path: Path,
) -> None:
    low = "[capture]\nenabled = true\nlow_confidence_below = 0.9999\n"
    repo = copy_models(examples, tmp_path / "repo", "digits", "mlp", configs={"digits": low})
    with serve(repo, fleet=fleet_settings(broker, cp, tmp_path / "state", "cap-low")) as agent:
        in_inventory(cp, "cap-low")
        y = send(agent, digits[:32])
        scores = np.exp(y - y.max(axis=1, keepdims=True))
        scores /= scores.sum(axis=1, keepdims=True)
        if np.allclose(y.sum(axis=1), 1, atol=1e-3) and y.min() >= 0:
            scores = y
        wanted = np.flatnonzero(scores.max(axis=1) < 0.9999)
        assert 0 < len(wanted) < 32, scores.max(axis=1)
        for _ in range(3):  # no [capture] in mlp's config: nothing
            mlp = agent.client.post(
                "/v2/models/mlp/infer",
                json={
                    "inputs": [
                        {
                            "name": "input",
                            "shape": [1, MLP_IN],
                            "datatype": "FP32",
                            "data": [0.5] * MLP_IN,
                        }
                    ]
                },
            )
            assert mlp.status_code == 200, mlp.text
        wait_until(lambda: len(samples(cp, "cap-low")) == 1, what="the low-confidence sample")
        (sample,) = samples(cp, "cap-low")
        assert sample["trigger"] == "low_confidence" and sample["rows"] == len(wanted)
        data = cp.admin.get(f"/api/v1/models/digits/versions/1/samples/{sample['id']}/data")
        with np.load(io.BytesIO(data.content), allow_pickle=False) as archive:
            np.testing.assert_array_equal(archive["input:input"], digits[:32][wanted])
        client = agent.state.fleet
        assert client is not None and client.capture is not None
        assert "mlp" not in client.capture.tap.snapshot()
    assert samples(cp, "cap-low", model="mlp") == []


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")  # MLflow's store's
@pytest.mark.filterwarnings("ignore::UserWarning:mlflow.*")
def test_an_export_is_logged_as_an_mlflow_runs_artifacts(
    cp: RunningControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with warnings.catch_warnings():  # mlflow's import-time note on its own Any type hints
        warnings.simplefilter("ignore", UserWarning)
        mlflow = pytest.importorskip("mlflow")
    if not [s for s in cp.admin.get("/api/v1/models/digits/versions/1/samples").json()["samples"]]:
        pytest.skip("no samples captured by the tests before")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("retrain", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(experiment)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the CLI's child process reads it
    exported = edgefleet(
        cp,
        *("data", "export", "digits", "--version", "1", "--to", str(tmp_path / "out")),
        *("--mlflow-run", run.info.run_id),
    )
    assert exported.returncode == 0, exported.stderr
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "samples/digits-v1")}
    assert "samples/digits-v1/index.json" in logged
    assert sum(p.endswith(".npz") for p in logged) >= 1
