"""A push is atomic: files that fail their checks leave no version behind and use up no
number; a push that never finished can be discarded (and is replaced by the next push of its
number half an hour on); a version can be archived, which hides it from the default listing
and from rollouts.

A real control plane (SQLite and PostgreSQL) and the example model files."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from runtimes.examples.variants import mlp_version
from tests.control_plane.conftest import ControlPlaneFactory
from tests.control_plane.test_operations import edgefleet
from tests.control_plane.test_rollouts import DEVICE_HEALTH, push, validate

SPEC = {"version": 2, "variants": [{"format": "onnx"}], "health": DEVICE_HEALTH}
FILE = "/api/v1/models/mlp/versions/2/variants/0/files/model.onnx"


def listed(client: httpx.Client, **params: str) -> dict[int, str]:
    doc = client.get("/api/v1/models", params=params).json()
    (mlp,) = [m for m in doc if m["name"] == "mlp"]
    return {v["version"]: v["stage"] for v in mlp["versions"]}


def test_files_that_fail_their_checks_leave_no_version(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    good = mlp_version(tmp_path / "v2", seed=2)
    with start_control_plane() as cp:
        push(cp.admin, "mlp", 1, [(mlp_version(tmp_path / "v1", seed=1), [])])
        assert cp.admin.post("/api/v1/models/mlp/versions", json=SPEC).status_code == 201
        refused = cp.admin.put(FILE, content=b"not an ONNX model")
        assert refused.status_code == 400
        assert "does not load" in refused.text and "was not kept" in refused.text
        assert cp.admin.get("/api/v1/models/mlp/versions/2").status_code == 404
        assert listed(cp.admin) == {1: "candidate"}
        push(cp.admin, "mlp", 2, [(good, [])])  # the same number, now with good files
        doc = cp.admin.get("/api/v1/models/mlp/versions/2").json()
        assert doc["complete"] and doc["variants"][0]["signature"]
        audit = cp.admin.get("/api/v1/audit").json()
        assert "version.discard" in {e["action"] for e in audit}


def test_a_push_that_never_finished_is_replaced_and_a_complete_one_is_not(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp:
        # a client that died after creating the version, before any file
        assert cp.admin.post("/api/v1/models/mlp/versions", json=SPEC).status_code == 201
        assert not cp.admin.get("/api/v1/models/mlp/versions/2").json()["complete"]
        busy = cp.admin.post("/api/v1/models/mlp/versions", json=SPEC)
        assert busy.status_code == 409 and "is being pushed" in busy.text  # maybe still alive
        assert cp.admin.delete("/api/v1/models/mlp/versions/2").status_code == 200
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        assert cp.admin.get("/api/v1/models/mlp/versions/2").json()["complete"]
        again = cp.admin.post("/api/v1/models/mlp/versions", json=SPEC)
        assert again.status_code == 409 and "immutable" in again.text
        kept = cp.admin.delete("/api/v1/models/mlp/versions/2")
        assert kept.status_code == 409 and "archived" in kept.text
        replaced = cp.admin.put(FILE, content=b"other bytes")  # its files stay what they are
        assert replaced.status_code == 409 and "immutable" in replaced.text


def test_an_archived_version_is_hidden_and_cannot_be_rolled_out(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp:
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        push(cp.admin, "mlp", 3, [(mlp_version(tmp_path / "v3", seed=3), [])])
        assert validate(cp.admin, "mlp", 2)["passed"]
        stage = "/api/v1/models/mlp/versions/{}/stage"
        assert cp.admin.post(stage.format(2), json={"stage": "archived"}).status_code == 200
        assert listed(cp.admin) == {3: "candidate"}
        assert listed(cp.admin, archived="true") == {2: "archived", 3: "candidate"}
        spec = {"model": "mlp", "version": 2, "selector": {}, "waves": ["100%"]}
        refused = cp.admin.post("/api/v1/rollouts", json=spec)
        assert refused.status_code == 409 and "archived" in refused.text
        # production is never archived from under the fleet
        assert cp.admin.post(stage.format(2), json={"stage": "production"}).status_code == 200
        kept = cp.admin.post(stage.format(2), json={"stage": "archived"})
        assert kept.status_code == 409 and "production" in kept.text


def test_the_cli_archives_lists_and_discards(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp:
        token = cp.token("operator")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        assert cp.admin.post("/api/v1/models/mlp/versions", json={**SPEC, "version": 3}).is_success
        assert edgefleet(cp, token, "models", "stage", "mlp", "2", "archived").returncode == 0
        shown = json.loads(edgefleet(cp, token, "models", "list", "--json").stdout)
        assert [v["version"] for v in shown[0]["versions"]] == [3]
        everything = edgefleet(cp, token, "models", "list", "--archived").stdout
        assert "v2 archived" in everything and "v3 candidate" in everything
        assert "discarded" in edgefleet(cp, token, "models", "discard", "mlp", "3").stdout
        kept = edgefleet(cp, token, "models", "discard", "mlp", "2")
        assert kept.returncode == 1 and kept.stderr.startswith("Error: 409"), kept.stderr
