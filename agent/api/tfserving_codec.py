"""TensorFlow Serving REST bodies <-> numpy: row (``instances``) and columnar (``inputs``) forms,
``{"b64": ...}`` values, and the status and metadata documents.

NOTE: https://github.com/tensorflow/serving/blob/master/tensorflow_serving/g3doc/api_rest.md
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
import orjson

from agent.api.v2_codec import NullInData, json_array
from agent.errors import BadJsonError, NullValueError, RequestError
from runtimes.signature import ModelSignature, TensorSpec

Arrays = dict[str, np.ndarray]

TF_DTYPES = {
    "BOOL": "DT_BOOL",
    "UINT8": "DT_UINT8",
    "UINT16": "DT_UINT16",
    "UINT32": "DT_UINT32",
    "UINT64": "DT_UINT64",
    "INT8": "DT_INT8",
    "INT16": "DT_INT16",
    "INT32": "DT_INT32",
    "INT64": "DT_INT64",
    "FP16": "DT_HALF",
    "BF16": "DT_BFLOAT16",
    "FP32": "DT_FLOAT",
    "FP64": "DT_DOUBLE",
    "BYTES": "DT_STRING",
}


def _fail(field: str, message: str) -> RequestError:
    return RequestError(f"{field}: {message}", field=field)


def decode_predict(
    body: bytes, signature: ModelSignature, *, max_elements: int
) -> tuple[Arrays, bool]:
    """Inputs of a ``:predict`` body, and whether it used the row format."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadJsonError(f"body: not valid JSON ({exc})", field="body") from None
    if not isinstance(doc, dict):
        raise _fail("body", "must be a JSON object")
    name = doc.get("signature_name", "serving_default")
    if name not in ("serving_default", ""):
        raise _fail(
            "signature_name", f"{name!r} is not a signature of this model (serving_default is)"
        )
    if ("instances" in doc) == ("inputs" in doc):
        raise _fail(
            "body", 'give exactly one of "instances" (row format) or "inputs" (columnar format)'
        )
    specs = {t.name: t for t in signature.inputs}
    if "instances" in doc:
        return _rows(doc["instances"], signature, specs, max_elements), True
    return _columns(doc["inputs"], signature, specs, max_elements), False


def _rows(
    instances: Any, signature: ModelSignature, specs: dict[str, TensorSpec], limit: int
) -> Arrays:
    if not isinstance(instances, list) or not instances:
        raise _fail("instances", "must be a non-empty list")
    named = all(isinstance(i, dict) and "b64" not in i for i in instances)
    if not named:
        if len(specs) != 1:
            raise _fail(
                "instances",
                f"the model has inputs {list(specs)}: each instance must be an object naming them",
            )
        only = next(iter(specs))
        return {
            only: _array(
                [_unb64(v, f"instances[{i}]") for i, v in enumerate(instances)],
                specs[only],
                "instances",
                limit,
            )
        }
    columns: dict[str, list[Any]] = {name: [] for name in specs}
    for i, instance in enumerate(instances):
        for key in instance:
            if key not in specs:
                raise _fail(
                    f"instances[{i}].{key}",
                    f"the model has no input {key!r} (it has {list(specs)})",
                )
        for name in specs:
            if name not in instance:
                raise _fail(f"instances[{i}].{name}", "is missing")
            columns[name].append(_unb64(instance[name], f"instances[{i}].{name}"))
    return {
        name: _array(values, specs[name], f"instances[*].{name}", limit)
        for name, values in columns.items()
    }


def _columns(
    inputs: Any, signature: ModelSignature, specs: dict[str, TensorSpec], limit: int
) -> Arrays:
    if isinstance(inputs, dict) and "b64" not in inputs:
        for key in inputs:
            if key not in specs:
                raise _fail(
                    f"inputs.{key}", f"the model has no input {key!r} (it has {list(specs)})"
                )
        missing = [n for n in specs if n not in inputs]
        if missing:
            raise _fail(f"inputs.{missing[0]}", "is missing")
        return {
            n: _array(_unb64(inputs[n], f"inputs.{n}"), specs[n], f"inputs.{n}", limit)
            for n in specs
        }
    if len(specs) != 1:
        raise _fail("inputs", f"the model has inputs {list(specs)}: give an object naming them")
    only = next(iter(specs))
    return {only: _array(_unb64(inputs, "inputs"), specs[only], "inputs", limit)}


def _unb64(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        if set(value) != {"b64"} or not isinstance(value["b64"], str):
            raise _fail(where, 'an object value must be {"b64": "<base64 string>"}')
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError) as exc:  # ValueError: not ASCII
            raise _fail(f"{where}.b64", f"is not valid base64 ({exc})") from None
    if isinstance(value, list):
        return [_unb64(v, where) for v in value]
    return value


def _array(values: Any, spec: TensorSpec, where: str, limit: int) -> np.ndarray:
    try:
        if spec.datatype == "BYTES":
            array = _strings(values, where)
        else:
            array = json_array(values, spec.datatype)  # numbers only: null is not NaN
    except NullInData as exc:
        message = f"{where}: cannot be read as {spec.datatype} (ragged or wrong type): {exc}"
        raise NullValueError(message, field=where) from None
    except (ValueError, TypeError, OverflowError, FloatingPointError) as exc:
        raise _fail(
            where, f"cannot be read as {spec.datatype} (ragged or wrong type): {exc}"
        ) from None
    if array.size > limit:
        raise _fail(
            where, f"{array.size} elements exceed the limit of {limit} (max_tensor_elements)"
        )
    return array


def _strings(values: Any, where: str) -> np.ndarray:
    """A string tensor of text values (str) and ``{"b64": ...}`` ones (bytes by now): a number,
    null or a list where a string belongs is refused, not sent to the model as "3" or "None"."""
    array = np.array(values, dtype=object)  # ragged nesting leaves lists as elements
    out = np.empty(array.shape, dtype=object)
    for i, value in enumerate(array.flat):
        if isinstance(value, str):
            out.flat[i] = value.encode()
        elif isinstance(value, bytes):
            out.flat[i] = value
        else:
            at = "".join(f"[{d}]" for d in np.unravel_index(i, array.shape))
            message = (
                f'string inputs take strings or {{"b64": ...}} objects, not {_json_kind(value)}'
            )
            error = NullValueError if value is None else RequestError
            raise error(f"{where + at}: {message}", field=where + at)
    return out


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, list):
        return "a list (the nesting is ragged)"
    return "a number" if isinstance(value, int | float) else type(value).__name__


def encode_predict(outputs: Arrays, rows: bool) -> bytes:
    """``{"predictions": ...}`` for the row format, ``{"outputs": ...}`` for the columnar one."""
    values = {name: _jsonable(name, array) for name, array in outputs.items()}
    if rows:
        if len(values) == 1:
            doc: Any = {"predictions": next(iter(values.values()))}
        else:
            n = len(next(iter(values.values())))
            doc = {"predictions": [{name: v[i] for name, v in values.items()} for i in range(n)]}
    else:
        doc = {"outputs": next(iter(values.values())) if len(values) == 1 else values}
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def _jsonable(name: str, array: np.ndarray) -> Any:
    if array.dtype.kind == "O" or name.endswith("_bytes"):
        return _bytes_tree(array.tolist(), b64=name.endswith("_bytes"))
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    return array.tolist() if array.ndim == 0 else array


def _bytes_tree(value: Any, b64: bool) -> Any:
    if isinstance(value, list):
        return [_bytes_tree(v, b64) for v in value]
    if isinstance(value, bytes):
        if not b64:
            try:
                return value.decode()
            except UnicodeDecodeError:
                pass
        return {"b64": base64.b64encode(value).decode()}
    return value


def status_document(versions: list[tuple[str, str, str]]) -> dict[str, Any]:
    """``GetModelStatusResponse`` JSON; versions are (version, state, error message)."""
    return {
        "model_version_status": [
            {
                "version": v,
                "state": state,
                "status": {"error_code": "OK" if not err else "UNKNOWN", "error_message": err},
            }
            for v, state, err in versions
        ]
    }


def metadata_document(name: str, version: str, signature: ModelSignature) -> dict[str, Any]:
    """``GetModelMetadataResponse`` JSON with one ``serving_default`` signature."""

    def tensors(specs: tuple[TensorSpec, ...]) -> dict[str, Any]:
        return {
            t.name: {
                "dtype": TF_DTYPES.get(t.datatype, "DT_INVALID"),
                "name": t.name,
                "tensor_shape": {
                    "dim": [{"size": str(d), "name": ""} for d in t.shape],
                    "unknown_rank": False,
                },
            }
            for t in specs
        }

    return {
        "model_spec": {"name": name, "signature_name": "", "version": version},
        "metadata": {
            "signature_def": {
                "signature_def": {
                    "serving_default": {
                        "inputs": tensors(signature.inputs),
                        "outputs": tensors(signature.outputs),
                        "method_name": "tensorflow/serving/predict",
                    }
                }
            }
        },
    }
