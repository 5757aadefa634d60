"""The console's wiring: its templates, login sessions and API client, the dependency that
gives each page its logged-in operator, and the login and logout pages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.staticfiles import StaticFiles
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from control_plane.api.deps import services
from control_plane.console.api import ApiRefused, ConsoleApi, in_process_client
from control_plane.console.sessions import (
    COOKIE,
    ConsoleSession,
    SessionStore,
    csrf_ok,
    secure_headers,
    set_cookie,
)
from control_plane.tokens import Role, authenticate

HERE = Path(__file__).parent
MAX_FORM_BYTES = 64 * 1024
"""A console form larger than this is refused (413) before it is parsed."""

router = APIRouter(prefix="/ui", include_in_schema=False)


class Console:
    """What every console page shares; one per application."""

    def __init__(self, app: FastAPI) -> None:
        self.templates = Jinja2Templates(directory=HERE / "templates")
        self.sessions = SessionStore()
        self.client = in_process_client(app)


class LoginNeeded(Exception):
    """No session, an expired one, or its token was revoked: the browser goes to the login."""


class BadForm(Exception):
    """A console form the console cannot read (not the API's verdict on its values)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Operator:
    """The logged-in operator of one request."""

    name: str
    role: Role
    session: ConsoleSession
    api: ConsoleApi

    @property
    def can_act(self) -> bool:
        return self.role >= Role.OPERATOR


def console(request: Request) -> Console:
    c: Console = request.app.state.console
    return c


async def operator(request: Request) -> Operator:
    c = console(request)
    session = c.sessions.get(request.cookies.get(COOKIE))
    if session is None:
        raise LoginNeeded()
    # checked on every page: a token revoked through the API ends its console sessions
    async with services(request).sessions() as s:
        principal = await authenticate(s, session.token)
    if principal is None:
        c.sessions.drop(request.cookies.get(COOKIE))
        raise LoginNeeded()
    return Operator(principal.name, principal.role, session, ConsoleApi(c.client, session.token))


OPERATOR = Depends(operator)


def same_site(request: Request) -> None:
    """Refuse a form that another site's page sent (its ``Origin`` is not this server)."""
    origin = request.headers.get("origin")
    # a page of another site sends its own origin, or "null" (a sandbox, no-referrer)
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise BadForm(403, "the form was sent from another site")


async def form(request: Request, who: Operator | None = None) -> dict[str, list[str]]:
    """An url-encoded form, its CSRF token checked when it comes from a logged-in page. A
    form that another site's page sent (its ``Origin`` is not this server) is refused, the
    login included."""
    same_site(request)
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise BadForm(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, max_num_fields=200)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadForm(400, f"the form cannot be read: {exc}") from exc
    if who is not None:
        sent = request.headers.get("x-csrf-token") or next(iter(fields.get("csrf", [])), None)
        if not csrf_ok(who.session, sent):
            raise BadForm(403, "the form's CSRF token is missing or wrong: reload the page")
    return fields


def render(
    request: Request, name: str, who: Operator | None, status: int = 200, **context: Any
) -> Response:
    context |= {"who": who, "csrf": who.session.csrf if who else ""}
    response = console(request).templates.TemplateResponse(
        request, name, context, status_code=status
    )
    return secure_headers(response)


def refresh_s(request: Request) -> float:
    """How often an open page re-reads what it watches (an active rollout, a device's
    presence): a rollout's read carries every device row (at 5,000 devices, an open page read
    every second cost the control plane 72 ms of CPU a second; benchmarks/console)."""
    return services(request).settings.console_live_interval_s


def redirect(url: str) -> Response:
    return secure_headers(RedirectResponse(url, status_code=303))


@router.get("/login")
async def login_page(request: Request) -> Response:
    return render(request, "login.html", None)


@router.post("/login")
async def login(request: Request) -> Response:
    token = (((await form(request)).get("token") or [""])[0]).strip()
    async with services(request).sessions() as s:
        principal = await authenticate(s, token) if token else None
    if principal is None:
        # the same words for an unknown, revoked or malformed token; the token is not echoed
        return render(request, "login.html", None, 401, error="the token is unknown or revoked")
    c = console(request)
    sid, _ = c.sessions.create(token)
    response = redirect("/ui/")
    set_cookie(response, sid, c.sessions.lifetime_s)
    return response


@router.post("/logout")
async def logout(request: Request, who: Operator = OPERATOR) -> Response:
    await form(request, who)
    console(request).sessions.drop(request.cookies.get(COOKIE))
    response = redirect("/ui/login")
    response.delete_cookie(COOKIE, path="/ui")
    return response


async def _login_needed(request: Request, exc: Exception) -> Response:
    if request.headers.get("hx-request"):
        # htmx follows no redirect into a fragment: it is told to load the login page
        response = Response(status_code=204, headers={"HX-Redirect": "/ui/login"})
        return secure_headers(response)
    return redirect("/ui/login")


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiRefused | BadForm)
    return render(request, "error.html", None, exc.status, message=exc.message)


def mount(app: FastAPI) -> None:
    """Serve the console under ``/ui/`` on ``app``'s own server."""
    from control_plane.console import (
        deployments,
        device_logs,
        edits,
        enrolment,
        fleet_admin,
        mlflow_sync,
        pages,
        rollouts,
        telemetry,
        uploads,
        windows,
    )

    app.state.console = Console(app)
    parts = (
        deployments,
        device_logs,
        edits,
        enrolment,
        fleet_admin,
        uploads,
        mlflow_sync,
        pages,
        rollouts,
        telemetry,
        windows,
    )
    for part in (router, *(p.router for p in parts)):
        app.include_router(part)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="console-static")
    app.add_exception_handler(LoginNeeded, _login_needed)
    app.add_exception_handler(ApiRefused, _refused)
    app.add_exception_handler(BadForm, _refused)


def confirmation(
    request: Request,
    who: Operator,
    *,
    title: str,
    meaning: str,
    action: str,
    back: str,
    button: str,
    reason: bool = False,
) -> Response:
    """A page that says what a change does; only its button (a CSRF-checked POST to
    ``action``) sends it. A viewer is told the role it needs and gets no button."""
    return render(
        request,
        "confirm_change.html",
        who,
        title=title,
        meaning=meaning,
        action=action,
        back=back,
        button=button,
        reason=reason,
    )
