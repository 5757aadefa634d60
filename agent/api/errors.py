"""Domain errors -> HTTP: one table and one handler.

The body is the V2 / TF Serving error shape, ``{"error": "<message>"}``, which unmodified
clients (tritonclient, TF Serving clients) read, plus a stable machine-readable ``code``. An
error that turns a request away is also counted by its reason (:func:`count_refusal`); which
errors are the domain's, their codes and the refusal reasons are every front end's
(:mod:`agent.serving.errors`).
"""

from __future__ import annotations

import logging

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Scope

from agent import errors as agent_errors
from agent.http.connection import REFUSED_KEY
from agent.pipelines import errors as pipeline_errors
from agent.serving.errors import answer_headers, error_code, refusal_reason
from agent.serving.failures import FailureLog
from common.model_config import ModelConfigError
from runtimes import errors as runtime_errors

log = logging.getLogger("edgefleet.agent.api")

# Most specific first: the first class an error is an instance of decides.
STATUS: tuple[tuple[type[Exception], int], ...] = (
    (pipeline_errors.StepInputError, 400),
    (pipeline_errors.ImageTooLargeError, 413),
    (pipeline_errors.DecodeBusyError, 503),
    (pipeline_errors.StepFailedError, 422),
    (pipeline_errors.StepCrashedError, 502),
    (pipeline_errors.StepTimeoutError, 504),
    (agent_errors.ModelNotFoundError, 404),
    (agent_errors.RequestError, 400),
    (agent_errors.PayloadTooLargeError, 413),
    (ClientDisconnect, 499),  # the client left mid-body; nobody reads the answer
    (agent_errors.UnauthorizedError, 401),
    (agent_errors.RateLimitedError, 429),
    (agent_errors.OverloadedError, 503),
    (agent_errors.ShuttingDownError, 503),
    (agent_errors.StorageError, 503),
    (agent_errors.ModelNotReadyError, 503),
    (agent_errors.DeadlineExceededError, 504),
    (agent_errors.MemoryBudgetError, 409),
    (agent_errors.LoadError, 400),
    (ModelConfigError, 400),
    (runtime_errors.InvalidInputError, 400),
    (runtime_errors.DeviceUnavailableError, 503),
    (runtime_errors.InferenceFailedError, 500),
    (runtime_errors.RuntimeFailure, 400),
)


def count_refusal(scope: Scope, exc: Exception) -> None:
    """Count ``exc``, about to be answered, if it turns the request away; the counter is the
    one the agent's HTTP protocol left in the scope (none under another server)."""
    count = scope.get(REFUSED_KEY)
    if count is None:
        return
    reason = refusal_reason(exc)
    if reason is not None:
        count(reason)


def status_of(exc: Exception) -> int:
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_parts(exc: Exception) -> tuple[int, dict[str, str], bytes]:
    """The status, headers (besides the content type, JSON) and body that answer ``exc``."""
    status = status_of(exc)
    code = error_code(exc)
    message = str(exc) if status != 500 or code != "internal" else "internal error"
    headers = answer_headers(exc, status)
    return status, headers, orjson.dumps({"error": message, "code": code})


def error_response(exc: Exception) -> Response:
    status, headers, body = error_parts(exc)
    return Response(body, status_code=status, headers=headers, media_type="application/json")


FAILURES = FailureLog(log)


def log_if_failed(path: str, exc: Exception) -> None:
    """An error answered 500 is logged: one line, with its traceback only if it is a bug
    (:mod:`agent.serving.failures`)."""
    if status_of(exc) == 500:
        FAILURES.failed("request failed", exc, path=path)


async def handle_error(request: Request, exc: Exception) -> Response:
    log_if_failed(request.url.path, exc)
    count_refusal(request.scope, exc)
    return error_response(exc)
