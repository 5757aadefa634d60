"""A generative model is hot-swapped like any model: the repository API loads and warms the
new version, new requests go to it, and a stream in flight finishes on the old one, which
closes after it."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import httpx

from tests.agent.openai.conftest import MODEL
from tests.agent.server import copy_models, serve, wait_until


def test_a_new_version_takes_new_requests_while_a_stream_finishes_on_the_old(
    lm_repository: Path, tmp_path: Path
) -> None:
    repository = copy_models(lm_repository, tmp_path / "repo", MODEL)
    with serve(repository) as agent:
        assert agent.state.generative is not None
        old = agent.state.generative.resolve(MODEL)
        chunks: list[dict[str, object]] = []
        first = threading.Event()

        def stream() -> None:
            body = {
                "model": MODEL,
                "prompt": "swap",
                "max_tokens": 200,
                "temperature": 0,
                "stream": True,
            }
            with (
                httpx.Client(base_url=agent.url, timeout=60) as client,
                client.stream("POST", "/v1/completions", json=body) as answer,
            ):
                for line in answer.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[6:]))
                        first.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(30)
        shutil.copytree(repository / MODEL / "1", repository / MODEL / "2")
        loaded = agent.client.post(f"/v2/repository/models/{MODEL}/load", json={})
        assert loaded.status_code == 200 and loaded.json()["versions"] == ["2"]
        answer = agent.client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "new", "max_tokens": 3}
        )
        assert answer.json()["system_fingerprint"] == f"edgefleet-{MODEL}-v2"
        reader.join(timeout=60)
        assert {c["system_fingerprint"] for c in chunks} == {f"edgefleet-{MODEL}-v1"}
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
        assert sum(1 for c in chunks if c["choices"][0]["text"]) > 150  # type: ignore[index]
        wait_until(lambda: old.engine.closed, what="the old version to close")
        assert agent.client.get("/v2/health/ready").status_code == 200
