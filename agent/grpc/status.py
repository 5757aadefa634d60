"""Domain errors -> gRPC status codes: one table, as the REST front end holds one for HTTP.

NOTE: codes as Triton's (src/grpc/grpc_utils.cc): a malformed request is INVALID_ARGUMENT,
an unknown model NOT_FOUND, a model or server that cannot take it now UNAVAILABLE.
"""

from __future__ import annotations

import grpc

from agent import errors as agent_errors
from agent.metrics import AgentMetrics
from agent.pipelines import errors as pipeline_errors
from agent.serving.errors import refusal_reason
from agent.shm import regions
from common.model_config import ModelConfigError
from runtimes import errors as runtime_errors

# Most specific first: the first class an error is an instance of decides.
CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (agent_errors.ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
    (regions.RegionPermissionError, grpc.StatusCode.PERMISSION_DENIED),
    (regions.RegionLimitError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (agent_errors.RequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (agent_errors.PayloadTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (agent_errors.UnauthorizedError, grpc.StatusCode.UNAUTHENTICATED),
    (agent_errors.RateLimitedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (agent_errors.OverloadedError, grpc.StatusCode.UNAVAILABLE),
    (agent_errors.ShuttingDownError, grpc.StatusCode.UNAVAILABLE),
    (agent_errors.StorageError, grpc.StatusCode.UNAVAILABLE),
    (agent_errors.ModelNotReadyError, grpc.StatusCode.UNAVAILABLE),
    (agent_errors.DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (agent_errors.MemoryBudgetError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (agent_errors.LoadError, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (runtime_errors.InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (runtime_errors.DeviceUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (runtime_errors.InferenceFailedError, grpc.StatusCode.INTERNAL),
    (runtime_errors.RuntimeFailure, grpc.StatusCode.INVALID_ARGUMENT),
    # a pipeline's steps, as REST answers them (400, 413, 503, 422, 502, 504)
    (pipeline_errors.StepInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (pipeline_errors.ImageTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (pipeline_errors.DecodeBusyError, grpc.StatusCode.UNAVAILABLE),
    (pipeline_errors.StepFailedError, grpc.StatusCode.INVALID_ARGUMENT),
    (pipeline_errors.StepCrashedError, grpc.StatusCode.INTERNAL),
    (pipeline_errors.StepTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
)


def code_of(exc: Exception) -> grpc.StatusCode | None:
    """The status for a domain error; None for anything else (a bug: INTERNAL, logged)."""
    for cls, code in CODES:
        if isinstance(exc, cls):
            return code
    return None


def count_refusal(metrics: AgentMetrics, exc: Exception) -> None:
    """Count ``exc`` in ``edgefleet_requests_refused_total`` if it turns a request away."""
    reason = refusal_reason(exc)
    if reason is not None:
        metrics.count_refusal(reason)
