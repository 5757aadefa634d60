"""Every console page passes axe-core's checks (labelled controls, landmarks, contrast,
names of links and buttons) and can be used from the keyboard alone."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.control_plane.console.conftest import Console, Fleet, axe_source
from tests.control_plane.test_rollouts import rollout

pytestmark = pytest.mark.slow

PAGES = [
    "/ui/",
    "/ui/devices",
    "/ui/devices/dev-a",
    "/ui/models",
    "/ui/models/mlp/versions/2",
    "/ui/rollouts",
    "/ui/rollouts/new",
    "/ui/rollouts/{rollout}",
    "/ui/rollouts/{rollout}/confirm/abort",
    "/ui/telemetry",
    "/ui/deployments",
    "/ui/windows",
    "/ui/claims",
    "/ui/enrolments",
    "/ui/costs",
    "/ui/keys",
]


def axe_violations(console: Console) -> list[dict[str, Any]]:
    # evaluated through the DevTools protocol, which the page's CSP does not govern: the
    # console itself loads no script that is not its own file
    console.page.evaluate(axe_source())
    result: dict[str, Any] = console.page.evaluate(
        "async () => await axe.run(document, {resultTypes: ['violations']})"
    )
    return [
        {"id": v["id"], "nodes": [n["target"] for n in v["nodes"]][:3]}
        for v in result["violations"]
    ]


@pytest.fixture(scope="module")
def a_rollout(fleet: Fleet) -> int:
    """A rollout to show: the oldest there is (the browser story's, when the package runs
    whole), or one of this module's own when it runs alone."""
    found = fleet.cp.admin.get("/api/v1/rollouts").json()
    return int(found[-1]["id"]) if found else rollout(fleet.cp, 3, bake_time_s=60)


@pytest.mark.parametrize("path", PAGES)
def test_axe_finds_no_violation(operator_console: Console, a_rollout: int, path: str) -> None:
    operator_console.go(path.format(rollout=a_rollout))
    expect(operator_console.page.locator("main h1")).to_be_visible()
    assert axe_violations(operator_console) == []


def test_the_login_page_passes_axe_too(operator_console: Console) -> None:
    page = operator_console.page
    context = page.context.browser.new_context() if page.context.browser else None
    assert context is not None
    try:
        login = Console(context.new_page(), operator_console.base)
        login.go("/ui/login")
        assert axe_violations(login) == []
        login.shot("login")
    finally:
        context.close()


def test_the_keyboard_reaches_every_page_and_the_rollout_form(operator_console: Console) -> None:
    page = operator_console.go("/ui/")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to content")
    visited = []
    for name in ("Devices", "Models", "Rollouts", "Telemetry"):
        for _ in range(10):  # Tab until the link has the focus
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.textContent.trim()") == name:
                break
        page.keyboard.press("Enter")
        expect(page.get_by_role("heading", level=1)).to_have_text(name)
        visited.append(page.url)
    assert [re.sub(r".*/ui/", "", u) for u in visited] == [
        "devices",
        "models",
        "rollouts",
        "telemetry",
    ]
    # every control of the rollout form is reached by Tab, and each has a label
    page = operator_console.go("/ui/rollouts/new")
    reached: list[str] = []
    for _ in range(40):
        page.keyboard.press("Tab")
        label = page.evaluate(
            "(() => { const e = document.activeElement;"
            " if (!['INPUT', 'SELECT', 'BUTTON'].includes(e.tagName)) return null;"
            " return e.labels && e.labels.length ? e.labels[0].textContent.trim()"
            " : e.textContent.trim(); })()"
        )
        if label:
            reached.append(label)
        if label == "Start the rollout":
            break
    assert reached[0] == "Log out" and reached[-1] == "Start the rollout"
    assert {"Model", "Version", "Largest error rate (0 to 1)"} <= set(reached), reached
