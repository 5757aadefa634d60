"""Errors as every front end tells them: which are the domain's, their codes, which turn a
request away.

The errors themselves are defined where they are raised (:mod:`agent.errors`,
:mod:`runtimes.errors`, :mod:`agent.pipelines.errors`, :mod:`common.model_config`), carry a
stable ``code`` and no status. Each front end holds one class -> status table over them (HTTP
in ``agent/api/errors.py``, gRPC in ``agent/grpc/status.py``) and takes from here what must be
the same on every wire: the code in an answer, and the refusal reason counted in
``edgefleet_requests_refused_total``.
"""

from __future__ import annotations

from agent import errors as agent_errors
from agent.metrics import RefusalReason
from agent.pipelines import errors as pipeline_errors
from common.model_config import ModelConfigError
from runtimes import errors as runtime_errors

DOMAIN_ERRORS: tuple[type[Exception], ...] = (
    agent_errors.AgentError,
    runtime_errors.RuntimeFailure,
    ModelConfigError,
    pipeline_errors.StepError,
)
"""The bases of the errors a request may meet that are answered as what they say; anything
else is a bug (answered as an internal error, and logged)."""

# The errors that turn a request away before any inference runs, most specific first. Not
# refusals: a failure once queued (a deadline, the runtime's own), a load that failed, a
# client gone.
REFUSALS: tuple[tuple[type[Exception], RefusalReason], ...] = (
    (agent_errors.BadJsonError, RefusalReason.BAD_JSON),
    (agent_errors.NullValueError, RefusalReason.NULL_VALUE),
    (agent_errors.RequestError, RefusalReason.INVALID_REQUEST),
    (runtime_errors.InvalidInputError, RefusalReason.INVALID_REQUEST),
    (pipeline_errors.StepInputError, RefusalReason.INVALID_REQUEST),
    (pipeline_errors.ImageTooLargeError, RefusalReason.INVALID_REQUEST),
    (pipeline_errors.DecodeBusyError, RefusalReason.QUEUE_FULL),
    (agent_errors.PayloadTooLargeError, RefusalReason.MAX_REQUEST_BYTES),
    (agent_errors.UnauthorizedError, RefusalReason.UNAUTHORIZED),
    (agent_errors.RateLimitedError, RefusalReason.RATE_LIMITED),
    (agent_errors.ModelNotFoundError, RefusalReason.MODEL_NOT_FOUND),
    (agent_errors.ModelNotReadyError, RefusalReason.MODEL_NOT_READY),
    (agent_errors.OverloadedError, RefusalReason.QUEUE_FULL),
    (agent_errors.ShuttingDownError, RefusalReason.SHUTTING_DOWN),
)


def refusal_reason(exc: Exception) -> RefusalReason | None:
    """Why ``exc`` turns its request away; None if it does not."""
    for cls, reason in REFUSALS:
        if isinstance(exc, cls):
            return reason
    return None


def error_code(exc: Exception) -> str:
    """The stable machine-readable code of ``exc``; ``internal`` for one that has none."""
    code: str = getattr(exc, "code", "internal")
    return code


def answer_headers(exc: Exception, status: int) -> dict[str, str]:
    """The headers every HTTP front end sends with the error answering ``exc``: when to retry
    (the error's own ``retry_after_s``, else 1 s for a 503) and, for a 401, the scheme."""
    headers: dict[str, str] = {}
    retry_after = getattr(exc, "retry_after_s", None)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    elif status == 503:
        headers["Retry-After"] = "1"
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="edgefleet"'
    return headers
