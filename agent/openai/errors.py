"""Domain errors -> OpenAI's error shape: one table and one renderer.

``{"error": {"message", "type", "param", "code"}}`` with the status OpenAI gives the same
condition (its API reference, "Error codes"), so the official client raises the class a user
expects (``NotFoundError``, ``BadRequestError``, ``RateLimitError``...). ``code`` is the core's
stable code (:func:`agent.serving.errors.error_code`); ``param`` is the field at fault.
"""

from __future__ import annotations

import orjson
from starlette.responses import Response

from agent import errors as agent_errors
from agent.serving.errors import answer_headers, error_code

OPENAI_PATHS = frozenset({"/v1/models", "/v1/completions", "/v1/chat/completions"})
"""Where a refusal before any route (API key, rate limit) is answered in OpenAI's shape;
``/v1/models/{m}`` is TF Serving's path too, and keeps the REST shape there."""

# Most specific first: the first class an error is an instance of decides.
STATUS: tuple[tuple[type[Exception], int, str], ...] = (
    (agent_errors.ModelNotFoundError, 404, "invalid_request_error"),
    (agent_errors.RequestError, 400, "invalid_request_error"),
    (agent_errors.PayloadTooLargeError, 413, "invalid_request_error"),
    (agent_errors.UnauthorizedError, 401, "authentication_error"),
    (agent_errors.RateLimitedError, 429, "rate_limit_error"),
    # the KV budget and the wait queue full (agent.generative.scheduler.KvBudgetFullError)
    (agent_errors.OverloadedError, 429, "rate_limit_error"),
    (agent_errors.ShuttingDownError, 503, "server_error"),
    (agent_errors.StorageError, 503, "server_error"),
    (agent_errors.ModelNotReadyError, 503, "server_error"),
)


def status_of(exc: Exception) -> tuple[int, str]:
    for cls, status, kind in STATUS:
        if isinstance(exc, cls):
            return status, kind
    return 500, "server_error"


def error_parts(exc: Exception) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body that answer ``exc``."""
    status, kind = status_of(exc)
    message = str(exc) if status != 500 else "internal error"
    headers = answer_headers(exc, status)
    body = {
        "message": message,
        "type": kind,
        "param": getattr(exc, "field", None),
        "code": error_code(exc) if status != 500 else "internal",
    }
    return status, headers, orjson.dumps({"error": body})


def openai_error_response(exc: Exception) -> Response:
    status, headers, body = error_parts(exc)
    return Response(body, status_code=status, headers=headers, media_type="application/json")
