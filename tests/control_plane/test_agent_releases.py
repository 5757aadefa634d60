"""Agent releases in the registry (``/api/v1/agent-releases``, ``edgefleet agents``): a release
tree's .tar.gz built at test time is stored by digest with the next fleet-wide sequence; bad
input is a 4xx naming the field, never a 500; a rollout of a release refuses what cannot judge
it. A real control plane (SQLite and PostgreSQL) and its artifact store."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from common.release_tree import pack, read_version
from tests.agent.launcher.harness import cli
from tests.control_plane.conftest import ControlPlaneFactory


def not_a_tree(path: Path) -> Path:
    """A .tar.gz with no release.json at its top."""
    with tarfile.open(path, "w:gz") as tar:
        data = b"print('hello')\n"
        info = tarfile.TarInfo("lib/hello.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_push_list_and_show_releases(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    first = pack(tmp_path / "agent-2.0.0.tar.gz", "2.0.0")
    second = pack(tmp_path / "agent-2.1.0.tar.gz", "2.1.0")
    assert read_version(first) == "2.0.0"
    with start_control_plane() as cp:
        env = {"EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": cp.token("operator")}
        pushed = cli("agents", "push", "2.0.0", str(first), env=env)
        assert pushed.returncode == 0, pushed.stderr
        assert pushed.stdout.startswith("agent release 2.0.0: sequence 1, ")
        doc = cp.admin.put("/api/v1/agent-releases/2.1.0", content=second.read_bytes()).json()
        assert doc["sequence"] == 2
        assert doc["sha256"] == hashlib.sha256(second.read_bytes()).hexdigest()
        # the artifact is served by digest, as a model's files are
        served = cp.admin.get(f"/artifacts/sha256/{doc['sha256']}")
        assert served.status_code == 200 and served.content == second.read_bytes()
        viewer = {"EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": cp.token("viewer")}
        listed = cli("agents", "list", env=viewer)
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert [line.split(":")[0] for line in lines] == ["2.0.0", "2.1.0"]
        as_json = json.loads(cli("agents", "list", "--json", env=viewer).stdout)
        assert [r["sequence"] for r in as_json] == [1, 2]
        with cp.client(cp.token("viewer")) as client:
            shown = client.get("/api/v1/agent-releases/2.0.0")
        assert shown.status_code == 200 and shown.json()["version"] == "2.0.0"


def test_bad_pushes_are_refused_naming_the_field(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    good = pack(tmp_path / "agent-2.0.0.tar.gz", "2.0.0")
    with start_control_plane() as cp, cp.client(cp.token("viewer")) as viewer:
        assert (
            viewer.put("/api/v1/agent-releases/2.0.0", content=good.read_bytes()).status_code == 403
        )
        unknown = viewer.get("/api/v1/agent-releases/9.9.9")
        assert unknown.status_code == 404 and "no agent release '9.9.9'" in unknown.text
        bad_version = cp.admin.put("/api/v1/agent-releases/.hidden", content=b"x")
        assert bad_version.status_code == 400 and "version:" in bad_version.json()["error"]
        junk = cp.admin.put("/api/v1/agent-releases/2.0.0", content=b"not a tarball")
        assert junk.status_code == 422 and junk.json()["error"].startswith("file: not a .tar.gz")
        tree = not_a_tree(tmp_path / "no-release.tar.gz")
        missing = cp.admin.put("/api/v1/agent-releases/2.0.0", content=tree.read_bytes())
        assert missing.status_code == 422 and "no release.json" in missing.text
        other = cp.admin.put("/api/v1/agent-releases/2.0.1", content=good.read_bytes())
        assert other.status_code == 422
        assert "its release.json names version '2.0.0', not '2.0.1'" in other.text
        assert (
            cp.admin.put("/api/v1/agent-releases/2.0.0", content=good.read_bytes()).status_code
            == 201
        )
        again = cp.admin.put("/api/v1/agent-releases/2.0.0", content=good.read_bytes())
        assert again.status_code == 409 and "immutable" in again.text
        assert [r["version"] for r in viewer.get("/api/v1/agent-releases").json()] == ["2.0.0"]


def test_agent_rollouts_refuse_what_cannot_judge_them(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    good = pack(tmp_path / "agent-2.0.0.tar.gz", "2.0.0")
    with start_control_plane() as cp:
        assert (
            cp.admin.put("/api/v1/agent-releases/2.0.0", content=good.read_bytes()).status_code
            == 201
        )

        def create(**spec: object) -> tuple[int, str]:
            answer = cp.admin.post("/api/v1/rollouts", json=spec)
            return answer.status_code, answer.json()["error"]

        both = create(agent_version="2.0.0", model="mlp", version=1)
        assert both == (
            400,
            "body: Value error, give agent_version, or model and version, not both",
        )
        assert create() == (400, "body: Value error, give model and version (or agent_version)")
        status, error = create(agent_version="2.0.0", gates={"max_drift": 0.2})
        assert status == 400 and "gates.max_drift judges a model" in error
        status, error = create(agent_version="2.0.0", shadow={})
        assert status == 400 and "shadow: an agent release cannot be shadowed" in error
        status, error = create(agent_version="../x")
        assert status == 400 and error.startswith("agent_version:")
        assert create(agent_version="7.0.0") == (404, "no agent release '7.0.0'")
        assert create(agent_version="2.0.0") == (
            400,
            "selector: no device matches the selector and profiles",
        )
        env = {"EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": cp.token("operator")}
        mixed = cli("rollouts", "create", "--agent", "2.0.0", "--model", "mlp", env=env)
        assert mixed.returncode == 1
        assert (
            "400 invalid_request: body: Value error, give agent_version, or model" in mixed.stderr
        )
