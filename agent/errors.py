"""Errors of the agent's inference service (transport-free).

Each class has a stable ``code``; ``agent/api/errors.py`` maps classes to HTTP statuses and the
fleet client reuses the codes in MQTT status reports. Errors from :mod:`runtimes` (bad inputs,
model files, devices) pass through unchanged and are mapped the same way::

    AgentError                      code
    +-- ModelNotFoundError          model_not_found      unknown model or version
    +-- ModelNotReadyError          model_not_ready      known, but loading, failed or unloading
    +-- RequestError                invalid_request      a malformed request body or parameter
    +-- PayloadTooLargeError        payload_too_large    body over max_request_bytes
    +-- UnauthorizedError           unauthorized         missing or unknown API key
    +-- RateLimitedError            rate_limited         over the client's rate; retry_after_s
    +-- OverloadedError             overloaded           queue full; carries retry_after_s
    +-- DeadlineExceededError       deadline_exceeded    timed out in the queue, never run
    +-- ShuttingDownError           shutting_down        no new work during shutdown
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


class LoadError(AgentError):
    code = "load_failed"


class MemoryBudgetError(LoadError):
    code = "memory_budget_exceeded"
