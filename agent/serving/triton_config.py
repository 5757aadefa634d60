"""A served version as Triton's model configuration (``ModelConfig`` of Triton's
``model_config.proto``), the one document that REST's ``GET /v2/models/{m}/config`` and gRPC's
``ModelConfig`` both answer, so that Triton's tools (perf_analyzer, Model Analyzer, the C++
client) read what they read from Triton.

Field by field, as Triton's own auto-complete writes it for an ONNX model: ``max_batch_size``
the model's configured batch size (0 for a model whose rows do not batch, whose first
dimension is then part of ``dims``), ``dims`` without the batch dimension,
``dynamic_batching`` with the agent's batching settings under Triton's names, one
``instance_group`` of the instances that opened, ``version_policy`` the versions served.
REST adds edgefleet's own document under the key ``edgefleet``; gRPC's ``ModelConfig`` message
has no room for it.
NOTE: https://github.com/triton-inference-server/common/blob/main/protobuf/model_config.proto
"""

from __future__ import annotations

from typing import Any

from agent.inference.pipelined import PipelineVersion
from agent.inference.versions import LoadedVersion
from common.model_config import BatchingConfig
from common.pipeline_config import ModelStep, PipelineConfig

_BACKENDS = {"onnxruntime": "onnxruntime", "openvino": "openvino", "litert": "tflite"}
"""Triton's backend names for the runtimes (LiteRT runs what Triton's TFLite backend does)."""


def data_type(datatype: str) -> str:
    """A V2 datatype (``FP32``) as Triton's ``DataType`` (``TYPE_FP32``; BYTES is STRING)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def triton_config(lv: LoadedVersion, served: list[int]) -> dict[str, Any]:
    """``lv`` as Triton's ``ModelConfig``, in protobuf's JSON form with its field names;
    ``served``: the version numbers the model serves now."""
    # A model whose rows batch (its first dimension free, its outputs split by rows) takes
    # requests of up to max_batch_size rows whether or not the batcher joins requests: the
    # measurement at load may have found that joining them does not pay (then no
    # dynamic_batching, as a Triton model served by its default scheduler).
    batched = lv.signature.batched and (lv.batcher.batched or lv.tuning is not None)

    def dims(shape: Any) -> list[int]:
        return [int(d) for d in (list(shape)[1:] if batched else shape)]

    device = lv.placement.device.upper()
    kind = "KIND_GPU" if device.startswith("GPU") else "KIND_MODEL"  # an NPU: the model's
    kind = "KIND_CPU" if device == "CPU" else kind
    doc: dict[str, Any] = {
        "name": lv.model,
        "platform": lv.platform,
        "backend": _BACKENDS.get(str(lv.placement.runtime), str(lv.placement.runtime)),
        "version_policy": {"specific": {"versions": sorted(served)}},
        "max_batch_size": lv.config.batching.max_batch_size if batched else 0,
        "input": [
            {
                "name": t.name,
                "data_type": data_type(t.datatype),
                "format": "FORMAT_NONE",
                "dims": dims(t.shape),
                "is_shape_tensor": False,
                "allow_ragged_batch": False,
                "optional": False,
            }
            for t in lv.signature.inputs
        ],
        "output": [
            {
                "name": t.name,
                "data_type": data_type(t.datatype),
                "dims": dims(t.shape),
                "label_filename": "",
                "is_shape_tensor": False,
            }
            for t in lv.signature.outputs
        ],
        "instance_group": [
            {
                "name": f"{lv.model}_0",
                "kind": kind,
                "count": lv.config.instances,
                "gpus": [0] if kind == "KIND_GPU" else [],
            }
        ],
        "model_transaction_policy": {"decoupled": False},
        "parameters": {},
    }
    if lv.batcher.batched:
        doc["dynamic_batching"] = dynamic_batching(lv.batcher.config)
    if isinstance(lv, PipelineVersion) and lv.pipeline is not None:
        doc["ensemble_scheduling"] = {"step": ensemble_steps(lv.pipeline.config)}
    return doc


def ensemble_steps(pipeline: PipelineConfig) -> list[dict[str, Any]]:
    """A pipeline's calls of other served models, as an ensemble's steps (Triton's tools read
    them to find the composing models); its other steps run inside the agent and have no
    counterpart. NOTE: perf_analyzer reads ``ensemble_scheduling.step`` of every model whose
    platform is ``ensemble`` and fails without it."""
    return [
        {"model_name": step.model, "model_version": -1, "input_map": {}, "output_map": {}}
        for _, step in pipeline.named_steps()
        if isinstance(step, ModelStep) and step.model
    ]


def dynamic_batching(config: BatchingConfig) -> dict[str, Any]:
    """The batcher's settings as Triton's ``ModelDynamicBatching``: a queue timeout of 0 is no
    timeout in both; a full queue refuses (``max_queue_size``) in both. The largest batch the
    batcher forms (measured at load, or configured) is its preferred size when none is given."""
    preferred = list(config.preferred_batch_sizes) or [config.max_batch_size]
    return {
        "preferred_batch_size": preferred,
        "max_queue_delay_microseconds": config.max_queue_delay_us,
        "preserve_ordering": config.preserve_ordering,
        "priority_levels": config.priority_levels,
        "default_priority_level": config.default_priority,
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": config.default_timeout_us,
            "allow_timeout_override": True,
            "max_queue_size": config.max_queue_size,
        },
    }
