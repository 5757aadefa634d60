"""MLflow registries as a source: ``edgefleet models push NAME VERSION models:/...`` and
``models sync``, against a real MLflow store on SQLite with a local artifact root, filled as a
data scientist would (``mlflow.onnx.log_model`` twice, an alias set), through the real CLI,
a real control plane (SQLite and PostgreSQL) and a real agent over the real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mlflow import MlflowClient

from control_plane.registry.mlflow_source import MlflowSourceError, ModelRef, without_credentials
from runtimes.examples.variants import mlp_version
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_rollouts import X, infer, rollout, wait_devices, wait_rollout
from tests.mqtt_broker import free_port

with warnings.catch_warnings():  # mlflow's import-time note on its own Any type hints
    warnings.simplefilter("ignore", UserWarning)
    import mlflow.onnx
    import mlflow.pyfunc

    class Echo(mlflow.pyfunc.PythonModel):  # a model without an ONNX flavour
        def predict(
            self, context: object, model_input: list[str], params: None = None
        ) -> list[str]:
            return model_input


ROOT = Path(__file__).resolve().parents[2]
# the MLflow client's own: its SQL store's noload, its notes on PythonModel type hints
pytestmark = [
    pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:mlflow.*"),
]
HEALTH = "[health]\nwindow_s = 0.2\nmin_requests = 100000\n"  # devices commit at once


@dataclass
class MlflowStore:
    """A real MLflow tracking store and registry, ``registered`` holding two ONNX versions."""

    uri: str
    root: Path
    run_ids: dict[int, str]
    client: MlflowClient

    def log_onnx(self, registered: str, seed: int, **kwargs: object) -> int:
        model = onnx.load(
            mlp_version(self.root / f"built-{registered}-{seed}", seed) / "model.onnx"
        )
        with mlflow.start_run() as run:
            info = mlflow.onnx.log_model(
                model, name="model", registered_model_name=registered, **kwargs
            )
        version = int(info.registered_model_version)
        self.run_ids[version] = run.info.run_id
        return version

    def artifact_outputs(self, uri: str, x: np.ndarray) -> np.ndarray:
        """ONNX Runtime's answer on the model file MLflow holds (with its external data)."""
        folder = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(self.root / "dl")))
        assert any(f.suffix == ".data" for f in folder.iterdir())  # weights in a side file
        session = ort.InferenceSession(folder / "model.onnx", providers=["CPUExecutionProvider"])
        return session.run(None, {"input": x})[0]  # type: ignore[no-any-return]


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MlflowStore]:
    with filled_store(tmp_path / "mlflow", monkeypatch) as store:
        yield store


@contextmanager
def filled_store(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MlflowStore]:
    """A store at ``root``: ``digits`` v1 and v2 logged, ``@champion`` on v1."""
    root.mkdir()
    uri = f"sqlite:///{root}/mlflow.db"
    # mlflow.set_tracking_uri and set_experiment export these to os.environ: put them back
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    try:
        experiment = mlflow.create_experiment("digits", artifact_location=(root / "art").as_uri())
        mlflow.set_experiment(experiment_id=experiment)
        store = MlflowStore(uri, root, {}, MlflowClient(uri))
        assert store.log_onnx("digits", seed=21) == 1
        assert store.log_onnx("digits", seed=22) == 2
        store.client.set_registered_model_alias("digits", "champion", "1")
        yield store
    finally:
        # no URI at all, not MLflow's default: that would be ./mlflow.db for the next caller
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]


def edgefleet(
    cp: RunningControlPlane, store: MlflowStore | None, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """The real CLI, in a child process, with MLFLOW_TRACKING_URI naming ``store``."""
    exe = Path(sys.executable).parent / "edgefleet"
    base = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    base |= {"EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": cp.token("operator")}
    base["PYTHONPATH"] = os.pathsep.join([*env.pop("PYTHONPATH", "").split(os.pathsep), str(ROOT)])
    if store is not None:
        base["MLFLOW_TRACKING_URI"] = store.uri
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, env=base | env, timeout=300
    )


def versions(cp: RunningControlPlane, name: str) -> dict[int, dict[str, object] | None]:
    models = {m["name"]: m for m in cp.admin.get("/api/v1/models?archived=true").json()}
    return {v["version"]: v["source"] for v in models.get(name, {"versions": []})["versions"]}


def test_uris_are_parsed_and_credentials_are_not_recorded() -> None:
    ref = ModelRef.parse("models:/digits@champion@generic-x86_64,raspberry-pi-5")
    assert (ref.registered_model, ref.version, ref.alias) == ("digits", None, "champion")
    assert (
        ref.profiles == ("generic-x86_64", "raspberry-pi-5")
        and ref.uri == "models:/digits@champion"
    )
    assert ModelRef.parse("models:/team/digits/3").registered_model == "team/digits"
    assert ModelRef.parse("models:/digits/3").version == 3
    for bad in ("models:/digits/Production", "models:/digits", "models:/digits@", "models:/@x"):
        with pytest.raises(MlflowSourceError):
            ModelRef.parse(bad)
    assert (
        without_credentials("https://ann:s3cret@mlflow.lab:5000/x") == "https://mlflow.lab:5000/x"
    )
    assert without_credentials("sqlite:////tmp/mlflow.db") == "sqlite:////tmp/mlflow.db"
    assert without_credentials("postgresql://u:p@db:x/mlflow") == "postgresql://db:x/mlflow"
    assert without_credentials("databricks://scope:prefix") == "databricks://scope:prefix"


@pytest.mark.slow
def test_mlflow_versions_are_pushed_validated_rolled_out_and_served(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    mlflow_store: MlflowStore,
    tmp_path: Path,
) -> None:
    config = tmp_path / "serving.toml"
    config.write_text(HEALTH)
    with start_control_plane() as cp, start_agent("dev-a", cp) as agent:
        wait_devices(cp, "dev-a")
        for version, uri in ((2, "models:/digits@champion"), (3, "models:/digits/2")):
            pushed = edgefleet(
                cp,
                mlflow_store,
                "models",
                "push",
                "mlp",
                str(version),
                uri,
                "--config",
                str(config),
            )
            assert pushed.returncode == 0, pushed.stderr
            assert "uploaded" in pushed.stdout and "model.onnx" in pushed.stdout
        runs = mlflow_store.run_ids
        assert versions(cp, "mlp") == {
            2: {
                "kind": "mlflow",
                "registered_model": "digits",
                "version": 1,
                "run_id": runs[1],
                "alias": "champion",
                "tracking_uri": mlflow_store.uri,
            },
            3: {
                "kind": "mlflow",
                "registered_model": "digits",
                "version": 2,
                "run_id": runs[2],
                "alias": None,
                "tracking_uri": mlflow_store.uri,
            },
        }
        listed = json.loads(edgefleet(cp, None, "models", "list", "--json").stdout)
        assert listed[0]["versions"][0]["source"]["run_id"] == runs[1]
        text = edgefleet(cp, None, "models", "list").stdout
        assert f"v2 from MLflow digits v1 (@champion, run {runs[1]})" in text, text
        doc = cp.admin.get("/api/v1/models/mlp/versions/2").json()
        assert doc["source"]["alias"] == "champion"
        audit = cp.admin.get("/api/v1/audit").json()
        created = [e["details"] for e in audit if e["action"] == "version.create"]
        assert sorted(d["source"]["run_id"] for d in created) == sorted(runs.values())
        # one self-contained file: MLflow's side file of weights folded back in
        assert [f["name"] for f in doc["variants"][0]["files"]] == ["model.onnx"]
        checked = edgefleet(cp, None, "models", "validate", "mlp", "2")
        assert checked.returncode == 0 and checked.stdout.strip().endswith("passed"), checked.stdout
        done = wait_rollout(cp, rollout(cp, 2, waves=["100%"]), "succeeded", "rolled_back")
        assert done["state"] == "succeeded", done
        served = infer(agent)
        assert served.status_code == 200 and served.json()["model_version"] == "2", served.text
        out = served.json()["outputs"][0]
        expected = mlflow_store.artifact_outputs("models:/digits/1", X)
        np.testing.assert_allclose(
            np.array(out["data"], np.float32).reshape(expected.shape),
            expected,
            rtol=1e-6,
            atol=1e-6,
        )


ONE_DATABASE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
"""Where the database is not what is tested (provenance on both: the end-to-end test)."""


@pytest.mark.slow  # a child process that imports mlflow per case
@ONE_DATABASE
def test_an_unresolvable_source_is_one_line_and_burns_no_version(
    start_control_plane: ControlPlaneFactory, mlflow_store: MlflowStore, tmp_path: Path
) -> None:
    with mlflow.start_run():
        mlflow.pyfunc.log_model(name="model", python_model=Echo(), registered_model_name="plain")
    no_mlflow = tmp_path / "no-mlflow"
    no_mlflow.mkdir()  # the interpreter as if the extra were not installed
    (no_mlflow / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None\n")
    dead = f"http://127.0.0.1:{free_port()}"
    cases = [
        ("models:/nope/1", {}, "nope"),
        ("models:/digits/9", {}, "version=9"),
        ("models:/digits@nope", {}, "alias nope"),
        ("models:/plain/1", {}, "no ONNX flavour (its flavours: python_function)"),
        (
            "models:/digits/1",
            {"MLFLOW_TRACKING_URI": dead, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"},
            dead,
        ),
        ("models:/digits/1", {"PYTHONPATH": str(no_mlflow)}, "pip install 'edgefleet[mlflow]'"),
        ("models:/digits/Production", {}, "use an alias"),
        ("models:/digits/1", {"MLFLOW_TRACKING_URI": "garbage://x"}, "MLflow at garbage://x: "),
    ]
    with start_control_plane() as cp:
        for uri, env, expected in cases:
            refused = edgefleet(cp, mlflow_store, "models", "push", "mlp", "1", uri, **env)
            assert refused.returncode == 1, (uri, refused.stdout)
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("Error: "), (uri, refused.stderr)
            assert expected in lines[0], (uri, lines[0])
        unset = edgefleet(cp, None, "models", "push", "mlp", "1", "models:/digits/1")
        assert unset.returncode == 1 and "MLFLOW_TRACKING_URI" in unset.stderr
        assert versions(cp, "mlp") == {}
        audit = {e["action"] for e in cp.admin.get("/api/v1/audit").json()}
        assert "version.create" not in audit  # nothing was sent before resolution failed


@pytest.mark.slow
@ONE_DATABASE
def test_sync_pushes_what_the_alias_points_at_once(
    start_control_plane: ControlPlaneFactory, mlflow_store: MlflowStore
) -> None:
    follow = ["models", "sync", "digits", "--from", "models:/digits@champion"]
    with start_control_plane() as cp:
        first = edgefleet(cp, mlflow_store, *follow)
        assert first.returncode == 0, first.stderr
        assert "digits v1: pushed from MLflow digits v1 (@champion" in first.stdout, first.stdout
        assert "passed validation" in first.stdout
        again = edgefleet(cp, mlflow_store, *follow)
        assert (
            again.returncode == 0 and "digits is up to date: v1 is MLflow digits v1" in again.stdout
        )
        assert list(versions(cp, "digits")) == [1]
        mlflow_store.client.set_registered_model_alias("digits", "champion", "2")
        # a sync whose client died after creating v2, before its files: not "up to date"
        source = {"kind": "mlflow", "registered_model": "digits", "version": 2}
        spec = {"version": 2, "variants": [{"format": "onnx"}], "source": source}
        assert cp.admin.post("/api/v1/models/digits/versions", json=spec).status_code == 201
        stuck = edgefleet(cp, mlflow_store, *follow)
        assert stuck.returncode == 1 and "digits v2 is an unfinished push" in stuck.stderr
        assert edgefleet(cp, None, "models", "discard", "digits", "2").returncode == 0
        unbounded = edgefleet(cp, None, *follow, "--rounds", "2")
        assert unbounded.returncode == 2 and "--interval-s" in unbounded.stderr
        moved = edgefleet(cp, mlflow_store, *follow, "--interval-s", "0.1", "--rounds", "3")
        assert moved.returncode == 0, moved.stderr
        assert moved.stdout.splitlines()[0].startswith("digits v2: pushed from MLflow digits v2")
        assert moved.stdout.count("digits is up to date: v2 is MLflow digits v2") == 2, moved.stdout
        shown = versions(cp, "digits")
        assert [(s or {}).get("version") for s in shown.values()] == [1, 2]
        doc = cp.admin.get("/api/v1/models/digits/versions/2").json()
        assert doc["validation"]["passed"] and doc["stage"] == "candidate"


@ONE_DATABASE
def test_extra_files_bring_a_pipelines_files_the_samples_and_an_openvino_variant(
    start_control_plane: ControlPlaneFactory, mlflow_store: MlflowStore
) -> None:
    ov = pytest.importorskip("openvino")  # the edgefleet[openvino] extra

    built = mlp_version(mlflow_store.root / "with-ir", seed=23)
    ov.save_model(
        ov.convert_model(str(built / "model.onnx")),
        str(built / "model.xml"),
        compress_to_fp16=False,
    )
    (built / "labels.txt").write_text("\n".join(f"digit {i}" for i in range(10)))
    extra = [str(built / f) for f in ("model.xml", "model.bin", "labels.txt", "golden.npz")]
    version = mlflow_store.log_onnx("digits-ir", seed=23, extra_files=extra)
    with start_control_plane() as cp:
        pushed = edgefleet(
            cp, mlflow_store, "models", "push", "digits", "1", f"models:/digits-ir/{version}"
        )
        assert pushed.returncode == 0, pushed.stderr
        doc = cp.admin.get("/api/v1/models/digits/versions/1").json()
        files = [sorted(f["name"] for f in v["files"]) for v in doc["variants"]]
        assert [v["format"] for v in doc["variants"]] == ["onnx", "openvino_ir"]
        assert files == [["labels.txt", "model.onnx"], ["labels.txt", "model.bin", "model.xml"]]
        assert doc["golden"]["name"] == "golden.npz"
        report = cp.admin.post("/api/v1/models/digits/versions/1/validate").json()
        assert report["passed"], report
        assert any(
            "passes its golden self-test" in c["check"] and "openvino" in c["check"]
            for c in report["checks"]
        )


def test_the_cli_loads_no_mlflow_until_a_source_names_it() -> None:
    """The extra costs nothing when off: building every command imports no mlflow."""
    code = "import sys; from common.cli import root; root(); print('mlflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr
