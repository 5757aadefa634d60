"""The console's client of the REST API: the control plane's own ASGI application, called in
process with the operator's token, so every read and action passes the routes' own checks."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from starlette.types import ASGIApp


class ApiRefused(Exception):
    """The API answered 4xx or 5xx: its status and its own message, shown to the operator."""

    def __init__(self, status: int, message: str, code: str = "") -> None:
        super().__init__(f"{status} {code}: {message}".strip())
        self.status, self.message, self.code = status, message, code


class ConsoleApi:
    """One operator's view of the API: ``call`` sends ``Authorization: Bearer <token>``."""

    def __init__(self, client: httpx.AsyncClient, token: str) -> None:
        self._client = client
        self._headers = {"Authorization": f"Bearer {token}"}

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = await self._send(method, path, **kwargs)
        return resp.json() if resp.content else None

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        resp = await self._client.request(method, path, headers=self._headers, **kwargs)
        if resp.status_code >= 400:
            try:
                body = resp.json()
                message, code = str(body["error"]), str(body.get("code", ""))
            except (ValueError, KeyError, TypeError):
                message, code = resp.text[:200] or resp.reason_phrase, ""
            raise ApiRefused(resp.status_code, message, code)
        return resp

    async def content(self, path: str) -> bytes:
        """The body of a GET that answers bytes, not JSON (a device's logs)."""
        return (await self._send("GET", path)).content

    async def get(self, path: str, **params: Any) -> Any:
        return await self.call("GET", path, params={k: v for k, v in params.items() if v})

    async def page(self, path: str, **params: Any) -> tuple[list[Any], str | None]:
        """A page of a paged list and the ``after`` of the next one (none: the last page),
        from the ``Link: <...>; rel="next"`` header."""
        resp = await self._send("GET", path, params={k: v for k, v in params.items() if v})
        link = resp.links.get("next")
        following = parse_qs(urlsplit(link["url"]).query).get("after") if link else None
        return resp.json(), following[-1] if following else None


def in_process_client(app: ASGIApp) -> httpx.AsyncClient:
    """An HTTP client whose requests go straight into ``app`` (no socket). The app's lifespan
    is not run again: the server that serves the console already ran it."""
    # NOTE: the transport buffers each response whole, as the API's responses are JSON docs
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://control-plane", timeout=60
    )
