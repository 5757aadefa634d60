"""The console's access rules over plain HTTP: a login session in an HttpOnly, SameSite=Strict
cookie, a CSRF token on every change, a Content-Security-Policy without inline scripts, the
token never in a URL or a log line, and clear 4xx for bad input."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import closing

import httpx
import pytest

from tests.control_plane.console.conftest import Fleet

pytestmark = pytest.mark.slow  # the shared fleet starts with the first of them

PAGES = [
    "/ui/",
    "/ui/devices",
    "/ui/devices/dev-a",
    "/ui/models",
    "/ui/rollouts",
    "/ui/rollouts/new",
    "/ui/telemetry",
    "/ui/deployments",
    "/ui/windows",
    "/ui/claims",
    "/ui/enrolments",
    "/ui/costs",
    "/ui/keys",
]


def logged_in(fleet: Fleet, token: str) -> httpx.Client:
    client = httpx.Client(base_url=fleet.cp.url, timeout=30)
    resp = client.post("/ui/login", data={"token": token})
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/"
    return client


@pytest.fixture
def operator(fleet: Fleet) -> Iterator[httpx.Client]:
    with closing(logged_in(fleet, fleet.admin_token)) as client:
        yield client


def csrf_of(client: httpx.Client) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/").text)
    assert match
    return match.group(1)


def test_the_session_cookie_is_httponly_strict_and_holds_no_token(fleet: Fleet) -> None:
    with httpx.Client(base_url=fleet.cp.url) as client:
        resp = client.post("/ui/login", data={"token": fleet.admin_token})
    cookie = resp.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert fleet.admin_token not in cookie and fleet.admin_token.split("_", 2)[2] not in cookie
    assert fleet.admin_token not in resp.headers["location"]


def test_a_wrong_token_is_refused_without_a_session(fleet: Fleet) -> None:
    with httpx.Client(base_url=fleet.cp.url) as client:
        resp = client.post("/ui/login", data={"token": "efp_0000_nope"})
        assert resp.status_code == 401 and "set-cookie" not in resp.headers
        assert "the token is unknown or revoked" in resp.text and "efp_0000_nope" not in resp.text
        page = client.get("/ui/devices")
        assert page.status_code == 303 and page.headers["location"] == "/ui/login"
        fragment = client.get("/ui/rollouts/1/progress", headers={"HX-Request": "true"})
        assert fragment.headers["hx-redirect"] == "/ui/login"


def test_every_page_has_the_csp_and_no_inline_script(operator: httpx.Client) -> None:
    for path in [*PAGES, "/ui/login"]:
        resp = operator.get(path)
        assert resp.status_code == 200, (path, resp.text[:300])
        csp = resp.headers["content-security-policy"]
        assert "script-src 'self';" in csp and "unsafe" not in csp
        scripts = re.findall(r"<script([^>]*)>", resp.text)
        assert scripts and all('src="/ui/static/' in s for s in scripts), (path, scripts)
        assert not re.search(r"\son[a-z]+\s*=", resp.text), path  # no inline event handler


def test_a_change_without_the_csrf_token_is_refused(operator: httpx.Client, fleet: Fleet) -> None:
    spec = {"model": "mlp", "version": "3", "selector": "site=lab", "bake_time_s": "60"}
    resp = operator.post("/ui/rollouts", data=spec)
    assert resp.status_code == 403 and "CSRF" in resp.text
    wrong = operator.post("/ui/rollouts", data=spec | {"csrf": "forged"})
    assert wrong.status_code == 403
    assert operator.post("/ui/logout").status_code == 403
    # the upload form is multipart: its token is checked all the same
    upload = {"name": "forged", "version": "1"}
    files = {"files": ("model.onnx", b"not a model")}
    resp = operator.post("/ui/models/new", data=upload, files=files)
    assert resp.status_code == 403 and "CSRF" in resp.text
    assert fleet.cp.admin.get("/api/v1/models/forged/versions/1").status_code == 404
    assert operator.get("/ui/").status_code == 200  # still logged in
    rollouts = fleet.cp.admin.get("/api/v1/rollouts").json()
    assert not any(r["version"] == 3 and r["state"] == "running" for r in rollouts)


def test_a_form_from_another_site_is_refused(operator: httpx.Client, fleet: Fleet) -> None:
    evil = {"origin": "http://attacker.example"}
    resp = operator.post("/ui/login", data={"token": fleet.admin_token}, headers=evil)
    assert resp.status_code == 403 and "set-cookie" not in resp.headers
    null = operator.post("/ui/login", data={"token": fleet.admin_token}, headers={"origin": "null"})
    assert null.status_code == 403
    resp = operator.post("/ui/logout", data={"csrf": csrf_of(operator)}, headers=evil)
    assert resp.status_code == 403 and "another site" in resp.text
    assert operator.get("/ui/").status_code == 200  # still logged in


def test_the_api_checks_the_values_of_a_form(operator: httpx.Client) -> None:
    csrf = csrf_of(operator)
    resp = operator.post(
        "/ui/rollouts",
        data={"csrf": csrf, "model": "mlp", "version": "2", "waves": "1, 150%"},
    )
    assert resp.status_code == 400 and "wave &#39;150%&#39; is out of range" in resp.text
    resp = operator.post(
        "/ui/rollouts", data={"csrf": csrf, "model": "mlp", "version": "2", "selector": "nolabel"}
    )
    assert resp.status_code == 400 and "selector: expected key=value" in resp.text


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        ("/ui/devices/no-such-device", 404, "no device"),
        ("/ui/rollouts/999999", 404, "no rollout 999999"),
        ("/ui/rollouts/abc", 400, "rollout_id"),
        ("/ui/devices?page=0", 400, "page"),
        ("/ui/devices?presence=asleep", 400, "state: one of online"),
        ("/ui/devices?model=mlp:x", 400, "model: expected model or model:version"),
        ("/ui/devices?after=..%2Fdev-a", 400, "after"),
        ("/ui/telemetry?mv=mlp", 400, "expected model:version"),
        ("/ui/rollouts/1/confirm/explode", 404, "no action"),
        ("/ui/models/mlp/versions/99", 404, "99"),
    ],
)
def test_bad_input_is_a_clear_4xx(
    operator: httpx.Client, path: str, status: int, words: str
) -> None:
    resp = operator.get(path)
    assert resp.status_code == status and words in resp.text, resp.text[:300]


def test_an_oversized_form_is_refused(operator: httpx.Client) -> None:
    resp = operator.post(
        "/ui/rollouts",
        content=b"a=" + b"x" * 70_000,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert resp.status_code == 413


def test_the_token_is_in_no_log_line(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    with closing(logged_in(fleet, fleet.viewer_token)) as client:
        for path in PAGES:
            client.get(path)
        client.post("/ui/rollouts/1/pause", data={"csrf": csrf_of(client)})
    secret = fleet.viewer_token.split("_", 2)[2]  # the secret itself may hold "_"
    assert caplog.records and not any(
        secret in r.getMessage() or secret in str(r.__dict__) for r in caplog.records
    )


def test_a_viewer_action_is_refused_by_the_api(fleet: Fleet) -> None:
    with closing(logged_in(fleet, fleet.viewer_token)) as client:
        resp = client.post("/ui/rollouts/1/pause", data={"csrf": csrf_of(client)})
    assert resp.status_code == 403 and "this needs the operator role" in resp.text


def test_a_viewer_rollout_is_refused_by_the_api_though_no_form_offers_it(fleet: Fleet) -> None:
    with closing(logged_in(fleet, fleet.viewer_token)) as client:
        assert "Start the rollout" not in client.get("/ui/rollouts/new").text
        form = {"csrf": csrf_of(client), "model": "mlp", "version": "3"}
        resp = client.post("/ui/rollouts", data=form)
    assert resp.status_code == 403 and "this needs the operator role" in resp.text


@pytest.mark.parametrize(
    ("path", "form"),
    [
        ("/ui/deployments", {"name": "v", "model": "mlp", "version": "2"}),
        ("/ui/deployments/any/version", {"version": "2"}),
        ("/ui/deployments/any/delete", {}),
        ("/ui/windows", {"name": "v", "cron": "0 2 * * *", "duration_s": "60"}),
        ("/ui/windows/any/delete", {}),
        ("/ui/claims", {"name": "v"}),
        ("/ui/claims/any/revoke", {}),
        ("/ui/enrolments/any/approve", {}),
        ("/ui/enrolments/any/reject", {}),
        ("/ui/devices/dev-a/labels", {"set": "line=3"}),
        ("/ui/devices/labels", {"device": "dev-a", "set": "line=3"}),
        ("/ui/models/mlp/versions/3/stage", {"stage": "production"}),
    ],
)
def test_a_viewer_change_on_the_operator_pages_is_refused_by_the_api(
    fleet: Fleet, path: str, form: dict[str, str]
) -> None:
    with closing(logged_in(fleet, fleet.viewer_token)) as client:
        resp = client.post(path, data={"csrf": csrf_of(client), **form})
    assert resp.status_code == 403 and "this needs the operator role" in resp.text, resp.text


@pytest.mark.parametrize(
    "path",
    [
        "/ui/deployments",
        "/ui/windows",
        "/ui/claims",
        "/ui/enrolments/any/approve",
        "/ui/devices/dev-a/labels",
        "/ui/devices/labels",
        "/ui/models/mlp/versions/3/stage",
    ],
)
def test_the_operator_forms_need_the_csrf_token(operator: httpx.Client, path: str) -> None:
    resp = operator.post(path, data={"name": "no-csrf", "cron": "0 2 * * *"})
    assert resp.status_code == 403 and "CSRF token is missing or wrong" in resp.text
