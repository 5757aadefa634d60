"""The ``classifier`` example end to end: JPEG bytes in, top-5 labels out, over real HTTP
(and gRPC)."""

from __future__ import annotations

import base64
import shutil
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from runtimes.examples.classifier import golden_jpeg, preprocess, top_k
from tests.agent.pipelines.conftest import jpeg
from tests.agent.server import RunningAgent, copy_models, serve
from tests.mqtt_broker import free_port

MAX_PIXELS = 200_000
MAX_REQUEST_PIXELS = 500_000
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
    pipelines = {"max_image_pixels": MAX_PIXELS, "max_request_pixels": MAX_REQUEST_PIXELS}
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
    assert [s["name"] for s in config["edgefleet"]["pipeline"]["steps"]][-1] == "top5"
    # Triton's view: an ensemble whose steps are the other models it calls (none: its own)
    assert config["platform"] == "ensemble" and config["ensemble_scheduling"] == {"step": []}


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


def test_a_step_error_over_grpc_is_its_status_not_internal(grpc_port: int) -> None:
    """As REST answers 400 and 413: INVALID_ARGUMENT and RESOURCE_EXHAUSTED with the message
    (a bad image was UNAVAILABLE, as if the server could not take it now)."""
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        for data, code, words in (
            (b"not an image at all", "StatusCode.INVALID_ARGUMENT", "step decode"),
            (jpeg(600, 400, 1), "StatusCode.RESOURCE_EXHAUSTED", "pipelines.max_image_pixels"),
        ):
            tensor = grpcclient.InferInput("image", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([data], dtype=object))
            with pytest.raises(InferenceServerException) as failed:
                client.infer("classifier", [tensor])
            assert failed.value.status() == code and words in failed.value.message()


def test_image_past_the_pixel_limit_is_a_413(client: triton.InferenceServerClient) -> None:
    with pytest.raises(triton.InferenceServerException) as failed:
        _infer(client, [jpeg(600, 400, 1)])
    assert failed.value.status() == "413"
    assert "240000 pixels" in failed.value.message()
    assert "pipelines.max_image_pixels" in failed.value.message()


def test_images_past_the_request_budget_are_a_413_before_decoding(
    client: triton.InferenceServerClient,
) -> None:
    """Each image under max_image_pixels, three together over max_request_pixels: refused
    from their headers (ten 16 Mpx PNGs once grew the agent by 650 MB)."""
    each = jpeg(475, 400, 2, "PNG")  # 190,000 pixels
    assert _infer(client, [each, each]).as_numpy("labels").shape == (2, 5)
    with pytest.raises(triton.InferenceServerException) as failed:
        _infer(client, [each, each, each])
    assert failed.value.status() == "413"
    assert "570000 pixels together" in failed.value.message()
    assert "pipelines.max_request_pixels" in failed.value.message()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels, with no image data to speak of:
    what a decompression bomb looks like to a decoder before it decodes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def test_a_bomb_header_is_the_documented_413(client: triton.InferenceServerClient) -> None:
    """30000 x 30000 is past twice Pillow's own limit, where Pillow raises before our check:
    still a 413 image_too_large, not a 400."""
    with pytest.raises(triton.InferenceServerException) as failed:
        _infer(client, [_png_header_only(30_000, 30_000)])
    assert failed.value.status() == "413"
    assert "pipelines.max_image_pixels" in failed.value.message()
    assert _infer(client, [golden_jpeg()]).as_numpy("labels").shape == (1, 5)


def test_step_past_its_timeout_is_a_504(client: triton.InferenceServerClient) -> None:
    with pytest.raises(triton.InferenceServerException) as failed:
        _infer(client, [golden_jpeg()], model="classifier_slow")
    assert failed.value.status() == "504"
    assert "step resize" in failed.value.message()
    assert _infer(client, [golden_jpeg()]).as_numpy("labels").shape == (1, 5)
