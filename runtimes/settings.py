"""Settings every backend reads; the agent nests them in its own settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RuntimeSettings(BaseModel):
    """Tuning shared by the backends. Per-candidate options in a hardware profile override
    the backend-specific ones."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        hide_input_in_errors=True,  # an error about the whole model would print its secrets
    )

    intra_op_threads: int = Field(default=0, ge=0)
    """Threads one inference may use; 0 lets the backend choose (all physical cores)."""

    inter_op_threads: int = Field(default=0, ge=0)
    """ONNX Runtime threads across independent graph nodes; 0 is the backend's default."""

    allow_spinning: bool = False
    """ONNX Runtime: let idle intra-op threads spin for new work. Off by default: on the
    few cores of an edge device the spinning threads take the cycles the server's own event
    loop needs (benchmarks/findings.md measures both), and they burn an idle device's power."""

    compute_nice_offset: int = Field(default=5, ge=0, le=19)
    """Nice steps below the event loop at which the inference threads run (Linux; 0 runs them
    alike). When the models keep the cores busy, the loop that reads requests, sheds load and
    answers health probes is then not preempted by them, and they take every cycle it leaves
    (benchmarks/findings.md measures it). They also yield to other processes of the same priority
    on the device, which is what a device running other work may want or may set to 0."""

    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    """ONNX Runtime graph optimisation level."""

    cache_dir: Path | None = None
    """Where compiled models are cached (ONNX Runtime optimised graphs, OpenVINO blobs,
    TensorRT engines), so a second start skips compilation. None disables caching."""

    openvino_performance_hint: Literal["LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"] = "LATENCY"
    """OpenVINO PERFORMANCE_HINT for compiled models."""

    openvino_cpu_precision: Literal["f32", "bf16", "f16"] | None = "f32"
    """OpenVINO INFERENCE_PRECISION_HINT on CPU. OpenVINO would otherwise pick bf16 on
    CPUs that have it, which changes outputs; None keeps OpenVINO's own choice."""
