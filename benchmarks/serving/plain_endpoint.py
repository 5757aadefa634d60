"""The baselines: what a user writes by hand, a FastAPI endpoint calling ONNX Runtime per request.

``app`` is idiomatic rather than tuned: a pydantic model of the V2 request, a synchronous
handler (FastAPI runs it in its thread pool), one ``session.run`` per request, JSON out.
``async_app`` is the fast hand-written endpoint: an ``async def`` handler that parses the body
with orjson, runs the session on the event loop (no thread hop: for a model of microseconds
the hop costs more than the model) and answers with orjson's bytes; uvicorn runs it on uvloop
and httptools. Both accept the same V2 JSON bodies as the agent, so the load generator sends
identical bytes to every system::

    EDGEFLEET_BENCH_MODEL=models/mlp/1/model.onnx uvicorn benchmarks.serving.plain_endpoint:app
    EDGEFLEET_BENCH_MODEL=models/mlp/1/model.onnx:models/cnn/1/model.onnx \\
        uvicorn benchmarks.serving.plain_endpoint:async_app --loop uvloop --http httptools

``EDGEFLEET_BENCH_MODEL`` holds one or more model files (``os.pathsep`` between them), each
served under the name of the folder above its version folder (``models/mlp/1/model.onnx``:
``mlp``), with ONNX Runtime's default session options.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
from fastapi import FastAPI, HTTPException, Request, Response
from pydantic import BaseModel


class Tensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    data: list[float]


class InferenceRequest(BaseModel):
    inputs: list[Tensor]


def _sessions() -> dict[str, ort.InferenceSession]:
    files = [Path(p) for p in os.environ["EDGEFLEET_BENCH_MODEL"].split(os.pathsep) if p]
    return {
        f.parent.parent.name: ort.InferenceSession(str(f), providers=["CPUExecutionProvider"])
        for f in files
    }


sessions = {name: (s, s.get_inputs()[0].name) for name, s in _sessions().items()}
app = FastAPI()
async_app = FastAPI()


def _session(name: str) -> tuple[ort.InferenceSession, str]:
    """The session serving ``name`` and its input's name; with one model, any name."""
    found = sessions.get(name) if len(sessions) > 1 else next(iter(sessions.values()))
    if found is None:
        raise HTTPException(404, f"unknown model {name!r}")
    return found


@app.get("/v2/health/ready")
@async_app.get("/v2/health/ready")
async def ready() -> dict[str, bool]:
    return {"ready": True}


@app.post("/v2/models/{name}/infer")
def infer(name: str, request: InferenceRequest) -> dict[str, Any]:
    tensor = request.inputs[0]
    session, input_name = _session(name)
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


@async_app.post("/v2/models/{name}/infer")
async def infer_async(name: str, request: Request) -> Response:
    tensor = orjson.loads(await request.body())["inputs"][0]
    session, input_name = _session(name)
    x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    (y,) = session.run(None, {input_name: x})
    doc = {
        "model_name": name,
        "outputs": [
            {"name": "output", "shape": list(y.shape), "datatype": "FP32", "data": y.ravel()}
        ],
    }
    return Response(
        orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
    )
