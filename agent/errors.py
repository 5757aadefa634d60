"""Errors of the agent's inference service (transport-free).

Each class has a stable ``code``; each front end maps classes to its statuses in one table
(``agent/api/errors.py`` HTTP, ``agent/grpc/status.py`` gRPC), :mod:`agent.serving.errors`
tells them which errors turn a request away, and the fleet client reuses the codes in MQTT
status reports. Errors from :mod:`runtimes` (bad inputs,
model files, devices) pass through unchanged and are mapped the same way::

    AgentError                      code
    +-- ModelNotFoundError          model_not_found      unknown model or version
    +-- ModelNotReadyError          model_not_ready      known, but loading, failed or unloading
    +-- RequestError                invalid_request      a malformed request body or parameter
    |   +-- BadJsonError            invalid_request      the body (or its JSON part) is not JSON
    |   +-- NullValueError          invalid_request      null where a tensor's value belongs
    |   +-- ContextLengthError      context_length_exceeded  prompt + max_tokens over the window
    +-- PayloadTooLargeError        payload_too_large    body over max_request_bytes
    +-- UnauthorizedError           unauthorized         missing or unknown API key
    +-- RateLimitedError            rate_limited         over the client's rate; retry_after_s
    +-- OverloadedError             overloaded           queue full; carries retry_after_s
    +-- DeadlineExceededError       deadline_exceeded    timed out in the queue, never run
    +-- ShuttingDownError           shutting_down        no new work during shutdown
    +-- StorageError                storage_unavailable  the device's disk refused a write
    +-- LoadError                   load_failed          a load, warm-up or self-test failed
    +-- MemoryBudgetError           memory_budget_exceeded
"""

from __future__ import annotations


class AgentError(Exception):
    code = "agent_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class ModelNotFoundError(AgentError):
    code = "model_not_found"


class ModelNotReadyError(AgentError):
    code = "model_not_ready"


class RequestError(AgentError):
    """The request is malformed; ``field`` names the offending part (``inputs[0].shape``)."""

    code = "invalid_request"


class BadJsonError(RequestError):
    """The body, or its JSON part, is not JSON: a refusal counted apart from other malformed
    requests (``edgefleet_requests_refused_total{reason="bad_json"}``)."""


class NullValueError(RequestError):
    """null where a tensor's value belongs (a client's NaN, often): counted apart
    (``reason="null_value"``)."""


class ContextLengthError(RequestError):
    """A generative request's prompt plus ``max_tokens`` is over the model's context window."""

    code = "context_length_exceeded"


class PayloadTooLargeError(AgentError):
    code = "payload_too_large"


class UnauthorizedError(AgentError):
    code = "unauthorized"


class RateLimitedError(AgentError):
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OverloadedError(AgentError):
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceededError(AgentError):
    code = "deadline_exceeded"


class ShuttingDownError(AgentError):
    code = "shutting_down"


class StorageError(AgentError):
    """What had to be stored before the answer (posted outcomes) could not be."""

    code = "storage_unavailable"


class LoadError(AgentError):
    code = "load_failed"


class MemoryBudgetError(LoadError):
    code = "memory_budget_exceeded"
