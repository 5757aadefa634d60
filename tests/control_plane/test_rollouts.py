"""The control plane end to end: a real Mosquitto, a real control plane (on SQLite and on
PostgreSQL), real agents of two hardware profiles."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, text

from control_plane.db.session import sync_url
from runtimes.examples.reference import mlp_forward
from runtimes.examples.variants import fragile_mlp_version, mlp_tflite_version, mlp_version
from runtimes.examples.weights import mlp_layers
from tests.agent.server import RunningAgent, wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane

X = np.random.default_rng(8).standard_normal((2, 256)).astype(np.float32)
DEVICE_HEALTH = {"window_s": 0.2, "min_requests": 100000}  # devices commit; the fleet gates judge


def push(
    client: httpx.Client,
    name: str,
    version: int,
    variants: list[tuple[Path, list[str]]],
    health: dict[str, Any] | None = None,
) -> None:
    fmts = [("tflite" if (d / "model.tflite").exists() else "onnx") for d, _ in variants]
    described = [{"format": f, "profiles": p} for f, (_, p) in zip(fmts, variants, strict=True)]
    spec = {"version": version, "variants": described, "health": health or DEVICE_HEALTH}
    resp = client.post(f"/api/v1/models/{name}/versions", json=spec)
    assert resp.status_code == 201, resp.text
    for i, (directory, _) in enumerate(variants):
        model_file = directory / ("model.tflite" if fmts[i] == "tflite" else "model.onnx")
        url = f"/api/v1/models/{name}/versions/{version}/variants/{i}/files/{model_file.name}"
        resp = client.put(url, content=model_file.read_bytes())
        assert resp.status_code == 200, resp.text
    resp = client.put(
        f"/api/v1/models/{name}/versions/{version}/golden",
        content=(variants[0][0] / "golden.npz").read_bytes(),
    )
    assert resp.status_code == 200


def validate(client: httpx.Client, name: str, version: int) -> dict[str, Any]:
    resp = client.post(f"/api/v1/models/{name}/versions/{version}/validate")
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def wait_devices(cp: RunningControlPlane, *ids: str) -> None:
    def online() -> bool:
        devices = {d["id"]: d for d in cp.admin.get("/api/v1/devices").json()}
        return all(i in devices and devices[i]["online"] for i in ids)

    wait_until(online, timeout_s=60, what=f"devices {ids} in the inventory")


def wait_rollout(
    cp: RunningControlPlane, rollout_id: int, *states: str, timeout_s: float = 90
) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
        return doc if doc["state"] in states else None

    try:
        wait_until(done, timeout_s=timeout_s, what=f"rollout {rollout_id} to be {states}")
    except TimeoutError as exc:
        doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
        raise TimeoutError(
            f"{exc}: {doc['state']} {doc['reason']} {doc['devices']} {doc['gate_report']}"
        ) from None
    return cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()  # type: ignore[no-any-return]


def infer(agent: RunningAgent, x: np.ndarray = X) -> httpx.Response:
    return agent.client.post(
        "/v2/models/mlp/infer",
        json={
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.ravel().tolist(),
                }
            ]
        },
    )


def served(agent: RunningAgent) -> str:
    resp = infer(agent)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["model_version"])


def rollout(cp: RunningControlPlane, version: int, **overrides: Any) -> int:
    spec = {
        "model": "mlp",
        "version": version,
        "selector": {"site": "lab"},
        "waves": ["1", "100%"],
        "bake_time_s": 0.5,
        "device_timeout_s": 60,
        **overrides,
    }
    # most tests send no traffic: their waves pass unjudged (by default they would wait for it)
    spec["gates"] = {"allow_unjudged": True, **overrides.get("gates", {})}
    resp = cp.admin.post("/api/v1/rollouts", json=spec)
    assert resp.status_code == 201, resp.text
    return int(resp.json()["id"])


@pytest.mark.slow
def test_push_validate_and_roll_out_in_waves_to_two_hardware_profiles(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    onnx_dir, tflite_dir = (
        mlp_version(tmp_path / "v2-onnx", seed=99),
        mlp_tflite_version(tmp_path / "v2-tflite", seed=99),
    )
    with start_control_plane() as cp, start_agent("dev-a", cp) as a, start_agent("dev-b", cp) as b:
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(onnx_dir, ["generic-x86_64"]), (tflite_dir, ["raspberry-pi-5"])])
        version = cp.admin.get("/api/v1/models/mlp/versions/2").json()
        assert version["variants"][0]["signature"]["inputs"][0]["shape"] == [-1, 256]
        assert validate(cp.admin, "mlp", 2)["passed"]
        rollout_id = rollout(cp, 2)
        doc = wait_rollout(cp, rollout_id, "succeeded", "rolled_back")
        assert doc["state"] == "succeeded", doc
        assert [(w["devices"], w["states"]) for w in doc["waves"]] == [
            (1, {"committed": 1}),
            (1, {"committed": 1}),
        ]
        expected = mlp_forward(X, mlp_layers(99))
        for agent, platform in ((a, "onnxruntime_onnx"), (b, "litert_tflite")):
            resp = infer(agent)
            assert resp.json()["model_version"] == "2"
            out = resp.json()["outputs"][0]
            np.testing.assert_allclose(
                np.array(out["data"]).reshape(2, 10), expected, rtol=1e-4, atol=1e-4
            )
            assert (
                agent.client.get("/v2/models/mlp").json()["platform"] == platform
            )  # its own artifact
        inventory = {d["id"]: d for d in cp.admin.get("/api/v1/devices").json()}

        def all_on_version_2() -> bool:
            devices = cp.admin.get("/api/v1/devices").json()
            return all(m["version"] == 2 for d in devices for m in d["models"])

        wait_until(all_on_version_2, what="the inventory to show version 2")
        assert inventory["dev-b"]["hardware_profile"] == "raspberry-pi-5"
        # the report's cost: v2 (after the requests above) beside v1, on its devices, priced
        # by profile once a rate is set
        put = cp.admin.put(
            "/api/v1/cost-rates", json={"rates": [{"profile": "raspberry-pi-5", "per_hour": 2}]}
        )
        assert put.status_code == 200, put.text

        def v2_priced() -> dict[str, Any] | None:
            cost = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()["cost"]
            return cost if (cost["candidate"] or {}).get("per_1k_predictions") else None

        wait_until(lambda: v2_priced() is not None, what="v2's cost in the rollout report")
        cost = v2_priced()
        assert cost is not None and cost["candidate"]["version"] == 2
        assert cost["candidate"]["busy_s"] > 0 and cost["candidate"]["rows"] >= 2
        assert cost["baseline"] is not None and cost["baseline"]["version"] == 1
        audit = cp.admin.get("/api/v1/audit").json()
        assert {"version.create", "version.upload", "version.validate", "rollout.create"} <= {
            e["action"] for e in audit
        }


@pytest.mark.slow
def test_error_rate_gate_failing_in_wave_1_rolls_back_every_touched_device(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp) as a, start_agent("dev-b", cp) as b:
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(fragile_mlp_version(tmp_path / "v2", seed=5), [])])
        assert validate(cp.admin, "mlp", 2)[
            "passed"
        ]  # its golden passes: the fault is on live traffic
        rollout_id = rollout(
            cp, 2, bake_time_s=60, gates={"max_error_rate": 0.05, "min_requests": 10}
        )
        wait_until(lambda: served(a) == "2", what="wave 1 (dev-a) to switch")
        poison = X.copy()
        poison[:, 0] = 500.0
        for _ in range(30):
            infer(a, poison)
        doc = wait_rollout(cp, rollout_id, "rolled_back", "succeeded")
        assert doc["state"] == "rolled_back" and "error rate" in doc["reason"], doc
        states = {d["device_id"]: d["state"] for d in doc["devices"]}
        assert states == {"dev-a": "reverted", "dev-b": "skipped"}
        assert served(a) == "1" and infer(a, poison).status_code == 200
        assert served(b) == "1"
        report = doc["gate_report"]["0"]
        assert report["errors"] >= 1 and report["error_rate"] > 0.05
        windows = cp.admin.get("/api/v1/telemetry", params={"rollout_id": rollout_id}).json()
        assert sum(w["errors"] for w in windows) >= report["errors"]  # the telemetry API shows them


@pytest.mark.slow
def test_version_failing_validation_cannot_be_rolled_out(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    v2 = mlp_version(tmp_path / "v2", seed=2)
    (v2 / "golden.npz").write_bytes(
        mlp_version(tmp_path / "other", seed=3).joinpath("golden.npz").read_bytes()
    )
    with start_control_plane() as cp, start_agent("dev-a", cp):
        wait_devices(cp, "dev-a")
        push(cp.admin, "mlp", 2, [(v2, [])])
        resp = cp.admin.post("/api/v1/rollouts", json={"model": "mlp", "version": 2})
        assert resp.status_code == 409 and "has not been validated" in resp.json()["error"]
        report = validate(cp.admin, "mlp", 2)
        assert not report["passed"]
        assert any("golden" in c["check"] and not c["passed"] for c in report["checks"])
        resp = cp.admin.post("/api/v1/rollouts", json={"model": "mlp", "version": 2})
        assert resp.status_code == 409 and "failed validation" in resp.json()["error"]
        resp = cp.admin.post("/api/v1/models/mlp/versions/2/stage", json={"stage": "production"})
        assert resp.status_code == 400


@pytest.mark.slow
def test_pause_resume_and_abort(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp) as a, start_agent("dev-b", cp) as b:
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        rollout_id = rollout(cp, 2, bake_time_s=1.0)
        assert cp.admin.post(f"/api/v1/rollouts/{rollout_id}/pause").json()["state"] == "paused"
        wait_until(lambda: served(a) == "2", what="wave 1 to switch while paused")
        doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
        assert doc["state"] == "paused" and doc["waves"][1]["states"] == {"pending": 1}
        assert served(b) == "1"
        assert cp.admin.post(f"/api/v1/rollouts/{rollout_id}/resume").json()["state"] == "running"
        assert wait_rollout(cp, rollout_id, "succeeded")["state"] == "succeeded"
        assert served(b) == "2"
        # abort a later rollout after its first wave: the touched device goes back
        push(cp.admin, "mlp", 3, [(mlp_version(tmp_path / "v3", seed=3), [])])
        validate(cp.admin, "mlp", 3)
        second = rollout(cp, 3, bake_time_s=60)
        wait_until(lambda: served(a) == "3", what="wave 1 of the second rollout")
        assert cp.admin.post(f"/api/v1/rollouts/{second}/abort").json()["state"] in (
            "rolling_back",
            "rolled_back",
        )
        doc = wait_rollout(cp, second, "rolled_back")
        assert doc["reason"].startswith("aborted by") and served(a) == "2" and served(b) == "2"
        assert cp.admin.post(f"/api/v1/rollouts/{second}/resume").status_code == 409


@pytest.mark.slow
def test_control_plane_restart_mid_rollout_resumes(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    first = ExitStack()
    cp = first.enter_context(start_control_plane())
    with start_agent("dev-a", cp) as a, start_agent("dev-b", cp) as b:
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        rollout_id = rollout(cp, 2, bake_time_s=3)
        wait_until(lambda: served(a) == "2", what="wave 1")
        first.close()  # the control plane goes away while wave 1 bakes
        assert served(b) == "1"
        with start_control_plane() as again:  # same database, same keys
            doc = wait_rollout(again, rollout_id, "succeeded")
            assert doc["state"] == "succeeded" and served(b) == "2"
            assert [w["states"] for w in doc["waves"]] == [{"committed": 1}, {"committed": 1}]


@pytest.mark.slow
def test_offline_device_catches_up_when_it_returns(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp) as a:
        with start_agent("dev-b", cp):
            wait_devices(cp, "dev-a", "dev-b")

        def dev_b_offline() -> bool:
            devices = {d["id"]: d for d in cp.admin.get("/api/v1/devices").json()}
            return not devices["dev-b"]["online"]

        wait_until(dev_b_offline, what="dev-b offline")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        rollout_id = rollout(cp, 2, waves=["100%"])
        wait_until(lambda: served(a) == "2", what="dev-a")
        time.sleep(0.3)
        assert (
            cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()["state"] == "running"
        )  # waiting for dev-b
        with start_agent("dev-b", cp) as b:
            doc = wait_rollout(cp, rollout_id, "succeeded")
            assert served(b) == "2" and doc["state"] == "succeeded"


@pytest.mark.slow
def test_roles(start_control_plane: ControlPlaneFactory, db_url: str) -> None:
    with (
        start_control_plane() as cp,
        cp.client(cp.token("viewer")) as viewer,
        cp.client(cp.token("operator")) as operator,
    ):
        assert viewer.get("/api/v1/models").status_code == 200
        resp = viewer.post("/api/v1/rollouts", json={"model": "mlp", "version": 1})
        assert resp.status_code == 403 and "needs the operator role" in resp.json()["error"]
        assert (
            viewer.post(
                "/api/v1/models/mlp/versions", json={"version": 1, "variants": [{"format": "onnx"}]}
            ).status_code
            == 403
        )
        assert (
            operator.post("/api/v1/tokens", json={"name": "x", "role": "admin"}).status_code == 403
        )
        assert httpx.get(f"{cp.url}/api/v1/models").status_code == 401
        assert (
            httpx.get(
                f"{cp.url}/api/v1/models", headers={"Authorization": "Bearer efp_nope_nope"}
            ).status_code
            == 401
        )
        # tokens are stored hashed: the database never holds the token itself
        token = cp.token("viewer", "hash-check")
        engine = create_engine(sync_url(db_url))
        with engine.connect() as conn:
            stored = [row[0] for row in conn.execute(text("SELECT secret_hash FROM api_tokens"))]
        engine.dispose()
        assert len(stored) >= 4 and all(token.split("_", 2)[2] not in h for h in stored)
