"""docs/model-quality.md's "The loop, end to end", run as it is shown: every ``$ edgefleet``
line of the section's console blocks, in order, through the real CLI, against a real MLflow
store on SQLite, control plane, broker and agent; between the blocks this test is the app
(inference, then the true labels posted back) and the data scientist (the retrained model
logged to MLflow, the alias moved). Each command's output must read as the page shows it,
numbers, ids and times aside."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import mlflow
import numpy as np
import onnx
import pytest

from control_plane.settings.ground_truth import GroundTruthSettings
from tests.agent.server import RunningAgent, serve, wait_until
from tests.control_plane.quality.test_ground_truth import fleet_settings
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import Mosquitto, free_port

with warnings.catch_warnings():  # mlflow's import-time note on its own Any type hints
    warnings.simplefilter("ignore", UserWarning)
    import mlflow.onnx

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "model-quality.md"
SECTION = "## The loop, end to end"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:mlflow.*"),
]
DEVICE = "loop-box"


def blocks() -> list[list[tuple[str, list[str]]]]:
    """The section's console blocks: each a list of (command, the output lines shown)."""
    text = PAGE.read_text()
    section = text[text.index(SECTION) + len(SECTION) :]
    section = section[: section.index("\n## ")]
    found = []
    for block in re.findall(r"^```console\n(.*?)^```", section, re.S | re.M):
        steps: list[tuple[str, list[str]]] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
        found.append(steps)
    return found


VARIABLE = re.compile(
    r"\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:\d\d|Z)?"  # a time
    r"|\b[0-9a-f]{32}\b"  # an MLflow run id
    r"|\d+(?:\.\d+)?"  # a number
)


def shape(line: str) -> str:
    return VARIABLE.sub("#", line.rstrip())


def reads_as_shown(shown: list[str], got: list[str]) -> bool:
    """``got`` line by line as ``shown``, numbers, ids and times aside; a shown ``  ...`` stands
    for any lines."""
    if not shown:
        return True
    head, *rest = shown
    if head.strip() == "...":
        return any(reads_as_shown(rest, got[i:]) for i in range(len(got) + 1))
    return bool(got) and shape(head) == shape(got[0]) and reads_as_shown(rest, got[1:])


class Walk:
    def __init__(self, cp: RunningControlPlane, workdir: Path, tracking_uri: str) -> None:
        token = cp.admin.headers["Authorization"].removeprefix("Bearer ")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        self.env = env | {
            "EDGEFLEET_URL": cp.url,
            "EDGEFLEET_TOKEN": token,
            "MLFLOW_TRACKING_URI": tracking_uri,
            "PYTHONPATH": str(ROOT),
        }
        self.workdir = workdir
        self.blocks = blocks()
        self.transcript: list[str] = []

    def block(self, number: int) -> None:
        """Run block ``number``'s commands; each must exit 0 and read as shown."""
        exe = str(Path(sys.executable).parent / "edgefleet")
        for command, shown in self.blocks[number]:
            words = shlex.split(command)
            assert words[0] == "edgefleet", command
            done = subprocess.run(
                [exe, *words[1:]],
                cwd=self.workdir,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            got = done.stdout.rstrip("\n").splitlines()
            self.transcript += [f"$ {command}", *got]
            assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
            assert reads_as_shown(shown, got), "\n".join(
                [f"$ {command}", "shown:", *shown, "got:", *got]
            )


def log_digits(version_dir: Path) -> str:
    """The data scientist's step: the ONNX file logged as ``digits``, ``@champion`` moved."""
    with mlflow.start_run() as run:
        info = mlflow.onnx.log_model(
            onnx.load(version_dir / "model.onnx"), name="model", registered_model_name="digits"
        )
    mlflow.MlflowClient().set_registered_model_alias(
        "digits", "champion", str(info.registered_model_version)
    )
    return str(run.info.run_id)


class App:
    """The app on the device: batches of 8 reference digits, then their true labels."""

    def __init__(self, agent: RunningAgent, x: np.ndarray, y: np.ndarray) -> None:
        self.agent, self.x, self.y, self.sent = agent, x, y, 0

    def run(self, requests: int) -> None:
        outcomes = []
        for _ in range(requests):
            rows = (np.arange(8) + 8 * self.sent) % len(self.x)
            self.sent += 1
            answer = self.agent.infer_json("digits", self.x[rows])
            assert answer.status_code == 200, answer.text
            outcomes.append({"id": answer.json()["id"], "labels": self.y[rows].tolist()})
        posted = self.agent.client.post("/v2/models/digits/feedback", json={"outcomes": outcomes})
        assert posted.status_code == 200 and posted.json()["joined"] == requests, posted.text


@pytest.fixture
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    root = tmp_path / "mlflow"
    root.mkdir()
    uri = f"sqlite:///{root}/mlflow.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    try:
        experiment = mlflow.create_experiment("digits", artifact_location=(root / "art").as_uri())
        mlflow.set_experiment(experiment_id=experiment)
        yield uri
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]


def test_the_loop_runs_as_the_page_shows(
    broker: Mosquitto, examples: Path, mlflow_uri: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    version_dir = examples / "digits" / "1"
    (work / "reference.npz").write_bytes((version_dir / "reference.npz").read_bytes())
    serving = PAGE.read_text().split("```toml\n# serving.toml\n", 1)[1].split("```", 1)[0]
    (work / "serving.toml").write_text(serving)
    with np.load(version_dir / "reference.npz") as data:
        x, y = data["input:input"].astype(np.float32), data["labels"].astype(int)
    log_digits(version_dir)  # v1 in MLflow, @champion
    truth = GroundTruthSettings(min_outcomes=50, check_interval_s=0.2)
    db = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
    with control_plane(tmp_path / "cp", db, broker.url, free_port(), ground_truth=truth) as cp:
        walk = Walk(cp, work, mlflow_uri)
        repo = tmp_path / "repo"
        repo.mkdir()  # the device starts with nothing: the fleet brings the model
        fleet = fleet_settings(broker, cp, tmp_path / "state", DEVICE)
        with serve(repo, fleet=fleet, wait_ready=False) as agent:
            wait_until(
                lambda: any(d["id"] == DEVICE for d in cp.admin.get("/api/v1/devices").json()),
                timeout_s=60,
                what="the device in the inventory",
            )
            app = App(agent, x, y)
            walk.block(0)  # push v1 from MLflow, validate, roll it out
            app.run(40)
            wait_until(lambda: outcomes(cp, 1) == 320, what="v1's outcomes")
            wait_until(lambda: captured(cp, 1) >= 1, what="a captured sample")
            walk.block(1)  # accuracy, captured samples, their export
            log_digits(version_dir)  # "retrained": v2 in MLflow, @champion moved
            walk.block(2)  # sync pushes v2, validated
            stop = threading.Event()

            def traffic() -> None:  # until the rollout ends: v2's outcomes for its gate
                while not stop.wait(0.2):
                    app.run(5)

            feeding = threading.Thread(target=traffic, name="app")
            feeding.start()
            try:
                walk.block(3)  # v2 rolled out gated on live accuracy, watched to the end
            finally:
                stop.set()
                feeding.join(timeout=60)
                print("\n".join(walk.transcript))
            judged = cp.admin.get("/api/v1/rollouts/2").json()["gate_report"]["0"]["accuracy"]
            assert judged["judged"] and judged["new"]["outcomes"] >= 50, judged
    assert (work / "samples" / "index.json").exists()


def outcomes(cp: RunningControlPlane, version: int) -> int:
    doc = cp.admin.get(f"/api/v1/models/digits/versions/{version}/accuracy").json()
    return int(doc["fleet"]["outcomes"]) if doc.get("fleet") else 0


def captured(cp: RunningControlPlane, version: int) -> int:
    doc = cp.admin.get("/api/v1/models/digits/samples").json()
    return sum(v.get("samples", 0) for v in doc["versions"] if v["version"] == version)
