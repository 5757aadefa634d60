"""The inference routes straight to their handler, past the router.

Under load the agent's event loop is its bottleneck, and for a small model FastAPI's routing
(matching every route in turn, its exception and exit-stack middleware, the request/response
wrappers) costs more than the inference itself. ``POST /v2/models/{m}[/versions/{v}]/infer``
is recognised here from the path and handed to :func:`agent.api.v2.infer` directly. It runs
inside the request context and admission middleware (access log, API keys, rate limit, body
deadline) like every other route, answers errors with the same handler, and is still documented
by the FastAPI route that declares it. It also skips FastAPI's outer middleware (server errors,
its own body limit: the handler enforces ``max_request_bytes`` itself).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from agent.api import v2
from agent.api.errors import handle_error


def infer_route(path: str) -> tuple[str, str | None] | None:
    """(model, version) of a V2 infer path, else None."""
    parts = path.split("/")
    if len(parts) == 5 and parts[:3] == ["", "v2", "models"] and parts[4] == "infer":
        return (parts[3], None) if parts[3] else None
    if (
        len(parts) == 7
        and parts[:3] == ["", "v2", "models"]
        and parts[4] == "versions"
        and parts[6] == "infer"
        and parts[3]
        and parts[5]
    ):
        return parts[3], parts[5]
    return None


class InferFastPath:
    """Wraps the FastAPI app (``app``); everything but the infer routes goes to it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            infer_route(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app  # what Starlette would set: handlers reach their state by it
        request = Request(scope, receive, send)
        try:
            response = await v2.infer(request, *route)
        except Exception as exc:  # a bug answers 500 with the error body, and is logged
            response = await handle_error(request, exc)
        await response(scope, receive, send)
