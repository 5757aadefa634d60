"""The ``classifier`` example end to end: JPEG bytes in, top-5 labels out, over real HTTP
(and gRPC)."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as triton

from runtimes.examples.classifier import golden_jpeg, preprocess, top_k
from tests.agent.server import RunningAgent, copy_models, serve
from tests.mqtt_broker import free_port
from tests.pipelines.conftest import jpeg

MAX_PIXELS = 200_000
SLOW_STEPS = "timeout_s = 0.000001\n"


@pytest.fixture(scope="module")
def grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def agent(
    example_repo: Path, tmp_path_factory: pytest.TempPathFactory, grpc_port: int
) -> Iterator[RunningAgent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("repo"), "classifier")
    # the same classifier, with a resize step allowed no time at all
    slow = repo / "classifier_slow"
    shutil.copytree(repo / "classifier", slow)
    steps = (slow / "1" / "pipeline.toml").read_text()
    (slow / "1" / "pipeline.toml").write_text(
        steps.replace('kind = "resize"\n', 'kind = "resize"\n' + SLOW_STEPS)
    )
    (slow / "1" / "pipeline_golden.npz").unlink()
    pipelines = {"max_image_pixels": MAX_PIXELS}
    grpc = {"enabled": True, "port": grpc_port}
    with serve(repo, pipelines=pipelines, grpc=grpc) as running:
        yield running


@pytest.fixture(scope="module")
def client(agent: RunningAgent) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(agent.url.removeprefix("http://"))
    yield c
    c.close()


def _direct(example_repo: Path, images: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """What an app does itself: decode and resize with Pillow, run the cnn with ONNX Runtime."""
    session = ort.InferenceSession(
        str(example_repo / "classifier/1/model.onnx"), providers=["CPUExecutionProvider"]
    )
    (logits,) = session.run(["logits"], {"input": preprocess(images, 224)})
    return top_k(logits)


def _infer(
    client: triton.InferenceServerClient, images: list[bytes], model: str = "classifier"
) -> triton.InferResult:
    tensor = triton.InferInput("image", [len(images)], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=object), binary_data=True)
    return client.infer(model, [tensor])


def test_tritonclient_gets_the_top5_of_pillow_and_onnxruntime(
    client: triton.InferenceServerClient, example_repo: Path
) -> None:
    images = [golden_jpeg(), golden_jpeg(400, 300, seed=3), jpeg(400, 300, 5, "PNG")]
    labels, scores = _direct(example_repo, images)
    for i, image in enumerate(images):  # one image per request
        result = _infer(client, [image])
        assert result.as_numpy("labels").tolist() == labels[i : i + 1].tolist()
        np.testing.assert_allclose(result.as_numpy("scores"), scores[i : i + 1], rtol=1e-3)
    batch = _infer(client, images)  # of three sizes, in one request
    assert batch.as_numpy("labels").tolist() == labels.tolist()


def test_grpc_carries_the_jpeg_too(agent: RunningAgent, grpc_port: int, example_repo: Path) -> None:
    image = golden_jpeg(300, 200, seed=4)
    labels, _ = _direct(example_repo, [image])
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        tensor = grpcclient.InferInput("image", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([image], dtype=object))
        result = client.infer("classifier", [tensor])
    assert result.as_numpy("labels").tolist() == labels.tolist()


def test_metadata_is_the_pipelines(client: triton.InferenceServerClient) -> None:
    doc = client.get_model_metadata("classifier")
    assert doc["platform"] == "ensemble"
    assert doc["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
    assert [o["name"] for o in doc["outputs"]] == ["labels", "scores"]
    assert doc["parameters"]["steps"][0] == "decode:decode_image"
    config = client.get_model_config("classifier")  # the version's own pipeline.toml
    assert [s["name"] for s in config["pipeline"]["steps"]][-1] == "top5"


def test_tf_serving_b64(agent: RunningAgent, example_repo: Path) -> None:
    image = golden_jpeg(200, 150, seed=8)
    labels, _ = _direct(example_repo, [image])
    body = {"instances": [{"b64": base64.b64encode(image).decode()}]}
    response = agent.client.post("/v1/models/classifier:predict", json=body)
    assert response.status_code == 200, response.text
    (prediction,) = response.json()["predictions"]
    assert prediction["labels"] == [x.decode() for x in labels[0]]


def test_per_step_timings_in_server_timing_and_metrics(
    agent: RunningAgent, client: triton.InferenceServerClient
) -> None:
    _infer(client, [golden_jpeg()])
    body = b'{"inputs":[{"name":"image","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":%d}}]}'
    image = golden_jpeg()
    header = body % (len(image) + 4)
    response = agent.client.post(
        "/v2/models/classifier/infer",
        content=header + len(image).to_bytes(4, "little") + image,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    timing = response.headers["server-timing"]
    for step in ("decode", "resize", "normalize", "layout", "cnn", "softmax", "top5"):
        assert f"step_{step};dur=" in timing
    metrics = agent.client.get("/metrics").text
    assert 'edgefleet_pipeline_step_seconds_count{model="classifier",step="cnn",version="1"}' in (
        metrics
    )


def test_corrupt_image_is_a_400_naming_the_step(client: triton.InferenceServerClient) -> None:
    cut = golden_jpeg()[:300]
    for data in (b"not an image at all", cut):
        with pytest.raises(triton.InferenceServerException) as failed:
            _infer(client, [data])
        assert failed.value.status() == "400"
        assert "step decode" in failed.value.message()


def test_image_past_the_pixel_limit_is_a_413(client: triton.InferenceServerClient) -> None:
    with pytest.raises(triton.InferenceServerException) as failed:
        _infer(client, [jpeg(600, 400, 1)])
    assert failed.value.status() == "413"
    assert "240000 pixels" in failed.value.message()
    assert "pipelines.max_image_pixels" in failed.value.message()


def test_step_past_its_timeout_is_a_504(client: triton.InferenceServerClient) -> None:
    with pytest.raises(triton.InferenceServerException) as failed:
        _infer(client, [golden_jpeg()], model="classifier_slow")
    assert failed.value.status() == "504"
    assert "step resize" in failed.value.message()
    assert _infer(client, [golden_jpeg()]).as_numpy("labels").shape == (1, 5)
