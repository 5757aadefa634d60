"""``POST /v2/models/{model}/feedback``: apps post the true outcomes of earlier predictions.

Body: ``{"outcomes": [{"id": "<request id>", "label": 3}, ...]}``, where ``id`` is the id the
infer response carried (the client's own, or the one the agent assigned) and ``label`` the
true class (classification) or value (regression); ``labels`` (a list, one per row) for a
request of several rows. Ids the agent no longer holds are counted in the answer, not
refused: an app cannot know which predictions were pushed out or expired. Gone to disk (for
the control plane) before the answer, where the agent follows a fleet.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from agent.errors import PayloadTooLargeError, RequestError
from agent.http.transport import json_response, read_body
from agent.serving.state import ServingState

router = APIRouter(tags=["Ground truth"])
MAX_ID_CHARS = 256
BYTES_PER_OUTCOME = 512
"""Body allowance per outcome the settings admit (an id, a label, JSON around them)."""


@router.post(
    "/v2/models/{model_name}/feedback",
    summary="Post the true outcomes of earlier predictions, by their request ids",
)
async def post_feedback(request: Request, model_name: str) -> Response:
    state: ServingState = request.app.state.api
    store = state.service.predictions
    if store is None:
        raise RequestError("ground truth is not kept by this agent", field="model_name")
    state.service.resolve(model_name, None)  # an unknown model: 404 before the body
    limit = store.settings.max_outcomes_per_post
    body = await read_body(request, limit * BYTES_PER_OUTCOME, "ground_truth.max_outcomes_per_post")
    outcomes = parse_outcomes(body, limit)
    result = store.join(model_name, outcomes)
    return json_response(
        {
            "model_name": model_name,
            "received": len(outcomes),
            "joined": result.joined,
            "unknown": result.unknown,
            "expired": result.expired,
            "mismatched": result.mismatched,
        }
    )


def parse_outcomes(body: bytes, limit: int) -> list[tuple[str, list[float]]]:
    """``(id, labels)`` per outcome of a feedback body.

    Raises:
        RequestError: naming the field at fault.
        PayloadTooLargeError: more than ``limit`` outcomes.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"body: not valid JSON ({exc})", field="body") from None
    if not isinstance(doc, dict):
        raise RequestError("body: must be a JSON object", field="body")
    unknown = set(doc) - {"outcomes"}
    if unknown:
        field = sorted(unknown)[0]
        raise RequestError(f"{field}: unknown field (outcomes only)", field=field)
    items = doc.get("outcomes")
    if not isinstance(items, list) or not items:
        raise RequestError("outcomes: must be a non-empty list", field="outcomes")
    if len(items) > limit:
        raise PayloadTooLargeError(
            f"outcomes: {len(items)} in one request, more than "
            f"ground_truth.max_outcomes_per_post ({limit})"
        )
    return [_outcome(i, item) for i, item in enumerate(items)]


def _outcome(i: int, item: Any) -> tuple[str, list[float]]:
    where = f"outcomes[{i}]"
    if not isinstance(item, dict):
        raise RequestError(f"{where}: must be an object with id and label", field=where)
    extra = set(item) - {"id", "label", "labels"}
    if extra:
        field = f"{where}.{sorted(extra)[0]}"
        raise RequestError(f"{field}: unknown field (id, label or labels)", field=field)
    request_id = item.get("id")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_ID_CHARS:
        field = f"{where}.id"
        raise RequestError(f"{field}: must be a request id of 1-{MAX_ID_CHARS} chars", field=field)
    if ("label" in item) == ("labels" in item):
        field = f"{where}.label"
        raise RequestError(f"{field}: give label (one row) or labels (a list)", field=field)
    labels = item["labels"] if "labels" in item else [item["label"]]
    key = "labels" if "labels" in item else "label"
    if not isinstance(labels, list) or not labels or not all(_number(v) for v in labels):
        field = f"{where}.{key}"
        raise RequestError(f"{field}: must be a number (or a list of numbers)", field=field)
    return request_id, [float(v) for v in labels]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
