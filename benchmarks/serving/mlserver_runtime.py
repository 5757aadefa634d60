"""The peer: an MLServer 1.7 custom runtime running the same ONNX model with ONNX Runtime.

This file is copied into the MLServer model directory by the benchmark and imported by
MLServer in its own virtual environment (``implementation: mlserver_runtime.OnnxRuntime``); it
is not imported by edgefleet. Adaptive batching is MLServer's own (``max_batch_size`` and
``max_batch_time`` in model-settings.json). Each predict appends the batch's row count to the
file named by ``EDGEFLEET_BENCH_BATCH_LOG`` so the benchmark can report MLServer's batch sizes.
"""

from __future__ import annotations

import os

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        uri = await get_model_uri(self.settings)
        self._session = ort.InferenceSession(uri, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        log = os.environ.get("EDGEFLEET_BENCH_BATCH_LOG")
        self._log = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT) if log else None
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        (y,) = self._session.run(None, {self._input: x})
        if self._log is not None:
            os.write(self._log, b"%d\n" % len(x))
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("output", y)]
        )
