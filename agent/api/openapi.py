"""OpenAPI descriptions of the bodies the inference routes decode by hand.

The routes read raw bytes (a pydantic model per tensor element would cost more than the
inference), so FastAPI cannot infer their request bodies; these ``openapi_extra`` blocks say
what the codecs accept, for users and for schema-driven fuzzing (tests/hardening).
NOTE: V2 request schema: https://github.com/kserve/open-inference-protocol (inference_rest.md);
TF Serving: https://github.com/tensorflow/serving/blob/master/tensorflow_serving/g3doc/api_rest.md
"""

from __future__ import annotations

from typing import Any

from runtimes.datatypes import V2_DATATYPES

_DATA: dict[str, Any] = {
    "description": "The values in row-major order, as a flat list or nested by dimension; "
    "strings for BYTES, true/false for BOOL.",
    "type": ["array", "number", "string", "boolean"],
}

V2_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {
            "type": "object",
            "properties": {
                "binary_data_output": {"type": "boolean"},
                "priority": {"type": "integer", "minimum": 0},
                "timeout": {"type": "integer", "minimum": 0, "description": "microseconds"},
            },
            "additionalProperties": True,
        },
        "inputs": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "shape", "datatype"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    "datatype": {"type": "string", "enum": sorted(V2_DATATYPES)},
                    "parameters": {
                        "type": "object",
                        "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
                        "additionalProperties": True,
                    },
                    "data": _DATA,
                },
            },
        },
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "binary_data": {"type": "boolean"},
                            "classification": {"type": "integer", "minimum": 0},
                        },
                        "additionalProperties": True,
                    },
                },
            },
        },
    },
}

TF_PREDICT: dict[str, Any] = {
    "type": "object",
    "description": 'Exactly one of "instances" (row format) or "inputs" (columnar format); '
    'string values may be {"b64": "<base64>"}.',
    "properties": {
        "signature_name": {"type": "string"},
        "instances": {"type": "array", "minItems": 1, "items": {}},
        "inputs": {},
    },
}

V2_INFER: dict[str, Any] = {
    "parameters": [
        {
            "name": "Inference-Header-Content-Length",
            "in": "header",
            "required": False,
            "description": "Length of the JSON head when binary tensor data follows it; "
            "0 when the whole body is the one input's raw bytes.",
            "schema": {"type": "integer", "minimum": 0},
        }
    ],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": V2_REQUEST},
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
            },
        },
    },
}

TF_INFER: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": TF_PREDICT}}}
}

TF_EXAMPLES: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["examples"],
                    "properties": {
                        "signature_name": {"type": "string"},
                        "context": {"type": "object"},
                        "examples": {"type": "array", "minItems": 1, "items": {"type": "object"}},
                    },
                }
            }
        },
    }
}
"""``:classify`` and ``:regress``: examples of features (agent/api/tfserving_examples.py)."""
