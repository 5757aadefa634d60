"""Console logins: a random session id in an HttpOnly, SameSite=Strict cookie; the operator's
token stays in this process's memory, never in a cookie, a URL or a log line. Each session has
its CSRF token, sent back with every form and htmx request that changes something."""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from starlette.responses import Response

COOKIE = "edgefleet_console"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
"""No inline script, style or event handler runs on a console page: only the files under
/ui/static/."""


@dataclass
class ConsoleSession:
    token: str
    csrf: str
    started_s: float = field(default_factory=time.monotonic)


class SessionStore:
    """Sessions in memory, the oldest dropped past ``max_sessions`` or ``lifetime_s``: a
    restart of the control plane logs everyone out, which is the safe way to lose them."""

    def __init__(self, lifetime_s: float = 12 * 3600, max_sessions: int = 1000) -> None:
        self.lifetime_s, self.max_sessions = lifetime_s, max_sessions
        self._sessions: OrderedDict[str, ConsoleSession] = OrderedDict()

    def create(self, token: str) -> tuple[str, ConsoleSession]:
        sid = secrets.token_urlsafe(32)
        session = ConsoleSession(token, secrets.token_urlsafe(32))
        self._sessions[sid] = session
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return sid, session

    def get(self, sid: str | None) -> ConsoleSession | None:
        session = self._sessions.get(sid) if sid else None
        if session is None:
            return None
        if time.monotonic() - session.started_s > self.lifetime_s:
            self.drop(sid)
            return None
        return session

    def drop(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(sid, None)


def csrf_ok(session: ConsoleSession, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(session.csrf.encode(), sent.encode())


def set_cookie(response: Response, sid: str, lifetime_s: float) -> None:
    response.set_cookie(
        COOKIE,
        sid,
        max_age=int(lifetime_s),
        path="/ui",
        httponly=True,
        samesite="strict",
        # NOTE: not `secure`: a plant network often serves plain http on 127.0.0.1 or a LAN;
        # behind TLS the proxy should add it (docs/console.md)
    )


def secure_headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    # NOTE: not no-referrer: under it, Chrome sends `Origin: null` with the console's own
    # forms, which the console's check of a form's origin could not tell from another site's
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response
