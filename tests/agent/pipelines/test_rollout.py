"""A fleet rollout of a classifier whose model takes another input size: the app sends the
same JPEG before and after, and gets the new version's answer with no change of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from runtimes.examples.classifier import golden_jpeg, preprocess, top_k, write_classifier
from tests.agent.fleet.artifacts import artifact_server
from tests.agent.fleet.conftest import fleet_settings
from tests.agent.fleet.publisher import Fleet
from tests.agent.server import copy_models, serve
from tests.mqtt_broker import Mosquitto


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Fleet, Mosquitto]]:
    """A private Mosquitto, an artifact server and the test-side fleet (as tests/agent/fleet's)."""
    broker = Mosquitto(tmp_path / "broker").start()
    try:
        with artifact_server(tmp_path / "artifacts") as artifacts:
            f = Fleet(broker.url, artifacts)
            try:
                yield f, broker
            finally:
                f.close()
    finally:
        broker.stop()


def _expected(version_dir: Path, image: bytes, size: int) -> list[list[bytes]]:
    session = ort.InferenceSession(
        str(version_dir / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (logits,) = session.run(["logits"], {"input": preprocess([image], size)})
    labels: list[list[bytes]] = top_k(logits)[0].tolist()
    return labels


def _app(url: str, image: bytes) -> tuple[str, list[list[bytes]]]:
    """The app: a JPEG to ``classifier``, labels back; it knows nothing of input sizes."""
    with triton.InferenceServerClient(url.removeprefix("http://")) as client:
        tensor = triton.InferInput("image", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([image], dtype=object))
        result = client.infer("classifier", [tensor])
        return result.get_response()["model_version"], result.as_numpy("labels").tolist()


@pytest.mark.slow
def test_a_new_input_size_needs_no_change_in_the_app(
    fleet: tuple[Fleet, Mosquitto], example_repo: Path, tmp_path: Path
) -> None:
    publisher, broker = fleet
    v2 = tmp_path / "v2"
    v2.mkdir()
    write_classifier(v2, image_size=160)  # model, steps, labels and golden: all artifacts
    image = golden_jpeg(500, 375, seed=21)
    repo = copy_models(example_repo, tmp_path / "repo", "classifier")
    settings = fleet_settings(publisher, broker, tmp_path / "state")
    before, after = _expected(repo / "classifier/1", image, 224), _expected(v2, image, 160)
    assert before != after  # the answer tells the versions apart
    with serve(repo, fleet=settings) as agent:
        assert _app(agent.url, image) == ("1", before)
        manifest = publisher.manifest("classifier", 2, 1, v2)
        publisher.publish_desired("dev-1", publisher.sign(manifest))
        publisher.wait_event("dev-1", "committed", sequence=1)
        assert _app(agent.url, image) == ("2", after)
        meta = agent.client.get("/v2/models/classifier").json()
        assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
        installed = {p.name for p in (repo / "classifier/2").iterdir()}
        assert {"model.onnx", "pipeline.toml", "labels.txt", "pipeline_golden.npz"} <= installed
