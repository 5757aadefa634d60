"""TensorFlow Serving's ``:classify`` and ``:regress`` bodies.

A request is ``{"signature_name"?, "context"?: {feature: value}, "examples": [{feature: value},
...]}``: each example, with the context's features added, names the model's inputs as an
instance of ``:predict``'s row format does. ``:classify`` answers ``{"result": [[[label, score],
...], ...]}``, one list of pairs per example; ``:regress`` answers ``{"result": [value, ...]}``.
Which output answers is the model's ``[tfserving]`` config; a model without it is a 400 naming
that section, as TF Serving answers a model with no classification signature.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from agent.api.tfserving_codec import decode_predict
from agent.errors import RequestError
from common.model_config import TfServingConfig
from runtimes.signature import ModelSignature

Arrays = dict[str, np.ndarray]


def _fail(field: str, message: str) -> RequestError:
    return RequestError(f"{field}: {message}", field=field)


def decode_examples(body: bytes, signature: ModelSignature, *, max_elements: int) -> Arrays:
    """The inputs of a ``:classify`` or ``:regress`` body, one row per example."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"body: not valid JSON ({exc})", field="body") from None
    if not isinstance(doc, dict):
        raise _fail("body", "must be a JSON object")
    unknown = set(doc) - {"signature_name", "context", "examples"}
    if unknown:
        raise _fail(
            sorted(unknown)[0],
            "not a field of this request (examples, context, signature_name are)",
        )
    context = doc.get("context", {})
    if not isinstance(context, dict):
        raise _fail("context", "must be an object of features")
    examples = doc.get("examples")
    if not isinstance(examples, list) or not examples:
        raise _fail("examples", "must be a non-empty list of objects")
    instances = []
    for i, example in enumerate(examples):
        if not isinstance(example, dict):
            raise _fail(f"examples[{i}]", "must be an object of features")
        clash = set(example) & set(context)
        if clash:
            raise _fail(f"examples[{i}].{sorted(clash)[0]}", "is given by the context too")
        instances.append({**context, **example})
    rebuilt = {"instances": instances}
    if "signature_name" in doc:
        rebuilt["signature_name"] = doc["signature_name"]
    try:
        inputs, _ = decode_predict(orjson.dumps(rebuilt), signature, max_elements=max_elements)
    except RequestError as exc:  # named as the client wrote it: examples, not instances
        field = (exc.field or "examples").replace("instances", "examples", 1)
        raise type(exc)(exc.message.replace("instances", "examples", 1), field=field) from None
    return inputs


def output_for(config: TfServingConfig, method: str, outputs: Arrays) -> np.ndarray:
    """The output that answers ``method`` (``classify`` or ``regress``)."""
    name = config.classify_output if method == "classify" else config.regress_output
    field = f"tfserving.{method}_output"
    if name is None:
        raise _fail(
            field, f"this model has no {method} signature: its config.toml [tfserving] names none"
        )
    if name not in outputs:
        raise _fail(field, f"{name!r} is not an output of this model (it has {sorted(outputs)})")
    return outputs[name]


@functools.lru_cache(maxsize=64)
def _labels(path: Path) -> tuple[str, ...]:
    return tuple(line.strip() for line in path.read_text().splitlines() if line.strip())


def labels(config: TfServingConfig, version_dir: Path, classes: int) -> list[str]:
    """The class labels of a version: its labels file's lines, else the indices."""
    if config.labels_file is None:
        return [str(i) for i in range(classes)]
    try:
        found = _labels(version_dir / config.labels_file)
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail("tfserving.labels_file", f"cannot be read: {exc}") from None
    if len(found) != classes:
        raise _fail(
            "tfserving.labels_file",
            f"holds {len(found)} labels for an output of {classes} classes",
        )
    return list(found)


def encode_classify(scores: np.ndarray, names: list[str]) -> bytes:
    rows = scores.reshape(len(scores), -1).astype(np.float64).tolist()
    result = [[[name, score] for name, score in zip(names, row, strict=True)] for row in rows]
    return orjson.dumps({"result": result})


def encode_regress(values: np.ndarray) -> bytes:
    flat = values.reshape(len(values), -1)
    if flat.shape[1] != 1:
        raise _fail(
            "tfserving.regress_output",
            f"holds {flat.shape[1]} values per example; :regress answers one",
        )
    result: list[Any] = flat[:, 0].astype(np.float64).tolist()
    return orjson.dumps({"result": result})
