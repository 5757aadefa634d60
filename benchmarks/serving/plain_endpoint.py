"""The baseline: what a user writes by hand, a FastAPI endpoint calling ONNX Runtime per request.

Idiomatic rather than tuned: a pydantic model of the V2 request, a synchronous handler (FastAPI
runs it in its thread pool), one ``session.run`` per request, JSON out. It accepts the same V2
JSON bodies as the agent, so the load generator sends identical bytes to both::

    EDGEFLEET_BENCH_MODEL=models/mlp/1/model.onnx uvicorn benchmarks.serving.plain_endpoint:app
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI
from pydantic import BaseModel


class Tensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    data: list[float]


class InferenceRequest(BaseModel):
    inputs: list[Tensor]


session = ort.InferenceSession(
    os.environ["EDGEFLEET_BENCH_MODEL"], providers=["CPUExecutionProvider"]
)
input_name = session.get_inputs()[0].name
app = FastAPI()


@app.get("/v2/health/ready")
def ready() -> dict[str, bool]:
    return {"ready": True}


@app.post("/v2/models/{name}/infer")
def infer(name: str, request: InferenceRequest) -> dict[str, Any]:
    tensor = request.inputs[0]
    x = np.asarray(tensor.data, dtype=np.float32).reshape(tensor.shape)
    (y,) = session.run(None, {input_name: x})
    return {
        "model_name": name,
        "outputs": [
            {
                "name": "output",
                "shape": list(y.shape),
                "datatype": "FP32",
                "data": y.ravel().tolist(),
            }
        ],
    }
