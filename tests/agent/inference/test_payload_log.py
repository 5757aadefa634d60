"""Payload logging with a real agent: the records of a model that opts in reach a JSON-lines
file and a real HTTP sink on 127.0.0.1, as digests or with their data; a model that does not
opt in is never recorded; a sink that is down costs requests nothing and is counted."""

from __future__ import annotations

import base64
import hashlib
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.model_config import PayloadLogConfig, PayloadLogMode
from tests.agent.server import copy_models, serve
from tests.mqtt_broker import free_port
from tests.otlp import posts_to

ROW = [0.5] * 256
DOC = {"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": ROW}]}


@pytest.fixture
def sink() -> Iterator[tuple[list[list[dict[str, Any]]], str]]:
    posted: list[list[dict[str, Any]]] = []
    with posts_to(lambda _, body: posted.append(json.loads(body)), status=204) as url:
        yield posted, f"{url}/payloads"


def test_records_reach_the_file_and_the_http_sink(
    example_repo: Path, tmp_path: Path, sink: tuple[list[list[dict[str, Any]]], str]
) -> None:
    posted, url = sink
    logged = '[payload_log]\nenabled = true\nmode = "tensors"\n'
    repo = copy_models(example_repo, tmp_path / "repo", "mlp", "cnn", configs={"mlp": logged})
    path = tmp_path / "payloads.jsonl"
    with serve(repo, payload_log={"path": path, "url": url}) as agent:
        for _ in range(3):
            assert agent.client.post("/v2/models/mlp/infer", json=DOC).status_code == 200
        x = np.zeros((1, 3, 224, 224), np.float32).tolist()
        cnn = {"inputs": [{"name": "input", "shape": [1, 3, 224, 224], "datatype": "FP32"}]}
        cnn["inputs"][0]["data"] = x
        assert agent.client.post("/v2/models/cnn/infer", json=cnn).status_code == 200
        answer = agent.client.post("/v2/models/mlp/infer", json=DOC).json()
    # the agent wrote what was queued as it stopped
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["model"] for r in records] == ["mlp"] * 4  # cnn did not opt in
    assert [r for batch in posted for r in batch] == records
    record = records[-1]
    assert record["version"] == "1" and record["time"].endswith("+00:00")
    tensor = record["inputs"]["input"]
    raw = np.full((1, 256), 0.5, np.float32).tobytes()
    assert tensor == {
        "datatype": "float32",
        "shape": [1, 256],
        "sha256": hashlib.sha256(raw).hexdigest(),
        "data_b64": base64.b64encode(raw).decode(),
    }
    logits = np.frombuffer(base64.b64decode(record["outputs"]["logits"]["data_b64"]), np.float32)
    np.testing.assert_allclose(logits, answer["outputs"][0]["data"], rtol=1e-6)


def test_a_sink_that_is_down_drops_records_counted_and_serves_on(
    example_repo: Path, tmp_path: Path
) -> None:
    logged = "[payload_log]\nenabled = true\n"  # digests only
    repo = copy_models(example_repo, tmp_path / "repo", "mlp", configs={"mlp": logged})
    dead = f"http://127.0.0.1:{free_port()}/payloads"
    with serve(repo, payload_log={"url": dead, "queue_records": 4}) as agent:
        answers = [agent.client.post("/v2/models/mlp/infer", json=DOC) for _ in range(20)]
        assert {a.status_code for a in answers} == {200}
        payloads = agent.state.service.payloads
        assert payloads is not None
    # every record was lost to the dead sink or the full queue, none silently
    assert payloads.written == 0 and payloads.dropped == 20
    text = agent.state.metrics.render().decode()
    assert "edgefleet_payload_records_dropped_total 20.0" in text


def test_digest_mode_and_the_size_cap_keep_data_out() -> None:
    from agent.inference.payload_log import tensor_record

    big = np.arange(1000, dtype=np.int64)
    digest = tensor_record(big, PayloadLogConfig(enabled=True))
    assert "data_b64" not in digest and digest["shape"] == [1000]
    capped = PayloadLogConfig(enabled=True, mode=PayloadLogMode.TENSORS, max_tensor_bytes=100)
    assert "data_b64" not in tensor_record(big, capped)
    small = tensor_record(np.array([b"ok", b"no"], dtype=object), capped)
    assert base64.b64decode(small["data_b64"]) == b"\x02\x00\x00\x00ok\x02\x00\x00\x00no"


def test_the_docs_payload_log_blocks_are_what_the_agent_takes(tmp_path: Path) -> None:
    from agent.settings import AgentSettings
    from common.model_config import ModelConfig

    text = (Path(__file__).resolve().parents[3] / "docs" / "agent.md").read_text()
    section = text.split("## Payload logging", 1)[1].split("\n## ", 1)[0]
    model_block, agent_block = (b.split("```", 1)[0] for b in section.split("```toml\n")[1:])
    model = ModelConfig.model_validate(tomllib.loads(model_block))
    assert model.payload_log.enabled and model.payload_log.sample_ratio == 0.05
    settings = AgentSettings(model_repository=tmp_path, **tomllib.loads(agent_block))
    assert settings.payload_log.path == Path("/var/lib/edgefleet/payloads.jsonl")
    assert settings.payload_log.url == "http://127.0.0.1:9000/payloads"
