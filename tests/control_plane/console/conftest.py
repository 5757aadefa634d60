"""The console's tests share one fleet and one browser: a real Mosquitto,
a real control plane on SQLite, two real agents of two hardware profiles (the example ``mlp``
v1), versions 2 and 3 pushed and validated, and Debian's headless Chromium driven by
Playwright."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, sync_playwright

from agent.fleet.settings import FleetSettings
from runtimes.examples.variants import mlp_version
from tests.agent.server import RunningAgent, copy_models, serve
from tests.control_plane.conftest import DEVICES
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.control_plane.test_rollouts import push, validate, wait_devices
from tests.mqtt_broker import Mosquitto, free_port

CHROMIUM = Path("/usr/bin/chromium")
DOC_SHOTS = Path(__file__).resolve().parents[3] / "docs" / "console"
SHOTS = (
    DOC_SHOTS
    if os.environ.get("EDGEFLEET_UPDATE_SHOTS") == "1"
    else Path(tempfile.gettempdir()) / f"edgefleet-console-shots-{os.getpid()}"
)
"""Where the screenshots go: docs/console/ only when asked (``EDGEFLEET_UPDATE_SHOTS=1``), so a
test run leaves the checkout as it found it."""


@dataclass
class Fleet:
    cp: RunningControlPlane
    agents: dict[str, RunningAgent]
    admin_token: str
    viewer_token: str


@pytest.fixture(scope="package")
def fleet(tmp_path_factory: pytest.TempPathFactory, example_repo: Path) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("console-fleet")
    with ExitStack() as stack:
        broker = Mosquitto(tmp / "broker").start()
        stack.callback(broker.stop)
        cp = stack.enter_context(
            control_plane(
                tmp / "cp-state",
                f"sqlite+aiosqlite:///{tmp}/cp.db",
                broker.url,
                free_port(),
                console_live_interval_s=0.5,
            )
        )
        agents = {}
        for device_id, (profile, labels) in DEVICES.items():
            repo = copy_models(example_repo, tmp / f"repo-{device_id}", "mlp")
            settings = FleetSettings(
                mqtt_url=broker.url,
                device_id=device_id,
                labels=labels,
                state_dir=tmp / f"state-{device_id}",
                trust_root_file=cp.trust_root_file,
                telemetry_interval_s=0.2,
                reconnect_min_s=0.05,
                reconnect_max_s=0.5,
            )
            agents[device_id] = stack.enter_context(serve(repo, profile=profile, fleet=settings))
        wait_devices(cp, *DEVICES)
        for version in (2, 3):
            push(cp.admin, "mlp", version, [(mlp_version(tmp / f"v{version}", seed=version), [])])
            assert validate(cp.admin, "mlp", version)["passed"]
        admin = (cp.state_dir / "admin-token").read_text().strip()
        yield Fleet(cp, agents, admin, cp.token("viewer", "console-viewer"))


@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    if not CHROMIUM.exists():
        pytest.fail("Debian's chromium is not installed: apt-get install chromium chromium-driver")
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
    yield browser
    browser.close()


@dataclass
class Console:
    """A logged-in browser tab, with every console error and failed request it saw."""

    page: Page
    base: str
    errors: list[str] = field(default_factory=list)

    def go(self, path: str) -> Page:
        self.page.goto(self.base + path)
        return self.page

    def shot(self, name: str) -> None:
        """A screenshot for docs/console.md."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def open_console(browser: Browser, fleet: Fleet, token: str) -> tuple[Console, ExitStack]:
    stack = ExitStack()
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    stack.callback(context.close)
    page = context.new_page()
    console = Console(page, fleet.cp.url)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            console.errors.append(f"{page.url}: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: console.errors.append(f"{page.url}: {exc}"))
    console.go("/ui/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(fleet.cp.url + "/ui/")
    return console, stack


@pytest.fixture(scope="module")
def operator_console(browser: Browser, fleet: Fleet) -> Iterator[Console]:
    console, stack = open_console(browser, fleet, fleet.admin_token)
    with stack:
        yield console


@pytest.fixture(scope="module")
def viewer_console(browser: Browser, fleet: Fleet) -> Iterator[Console]:
    console, stack = open_console(browser, fleet, fleet.viewer_token)
    with stack:
        yield console


@pytest.fixture(autouse=True)
def no_console_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every browser test ends with no console error (a CSP violation, a failed script or
    request, an uncaught exception) in the tabs it used."""
    yield
    for name in ("operator_console", "viewer_console"):
        if name in request.fixturenames:
            console: Console = request.getfixturevalue(name)
            errors, console.errors[:] = list(console.errors), []
            assert not errors, errors


def axe_source() -> str:
    return (Path(__file__).parent / "axe.min.js").read_text()
