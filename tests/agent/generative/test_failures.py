"""A model step that fails ends the sequences it ran with an error their front end reports
(500 in OpenAI's shape, an error event in a stream), never a silent 'stop'; the engine keeps
serving."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import httpx
import numpy as np

from runtimes.backends import open_model
from runtimes.base import Placement, Runtime
from runtimes.errors import InferenceFailedError
from runtimes.settings import RuntimeSettings
from runtimes.signature import ModelSignature
from tests.agent.server import serve


class BreakableRuntime(Runtime):
    """The real backend; fails every call while ``broken`` is set."""

    name = "onnxruntime"
    formats = frozenset()
    broken = False

    def __init__(self, inner: Runtime) -> None:
        super().__init__(inner.settings)
        self.inner = inner
        self._signature = inner.signature

    def _load(self, model_file: Path, placement: Placement) -> ModelSignature:
        raise AssertionError("built already loaded")

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if BreakableRuntime.broken:
            raise InferenceFailedError("the accelerator fell off the bus")
        return self.inner.infer(inputs)

    def _close(self) -> None:
        self.inner.close()


def breakable(model_file: Path, placement: Placement, settings: RuntimeSettings) -> Runtime:
    return BreakableRuntime(open_model(model_file, placement, settings))


def test_a_failed_step_is_an_error_whole_or_streamed_and_serving_goes_on(
    lm_repository: Path,
) -> None:
    with serve(lm_repository, runtime_factory=breakable) as agent:
        body = {"model": "tiny-lm", "prompt": "edge", "max_tokens": 5}
        BreakableRuntime.broken = True
        try:
            whole = agent.client.post("/v1/completions", json=body)
            with agent.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
                assert s.status_code == 200  # sent before the step ran
                payloads = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
            triton = agent.client.post("/v2/models/tiny-lm/generate", json={"text_input": "edge"})
        finally:
            BreakableRuntime.broken = False
        assert whole.status_code == 500 and whole.json()["error"]["type"] == "server_error"
        assert payloads[-1] == "[DONE]" and "error" in json.loads(payloads[-2])
        assert triton.status_code == 500
        engine = agent.state.generative.resolve("tiny-lm").engine  # type: ignore[union-attr]
        assert engine.in_flight == 0 and engine.scheduler.running == 0
        again = httpx.post(f"{agent.url}/v1/completions", json=body, timeout=30)
        assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 5
