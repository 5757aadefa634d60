"""A device's logs and support bundle from its console page: an operator asks, the answer
arrives from the real agent and downloads; a viewer's page offers none of it and a viewer's
download is refused."""

from __future__ import annotations

import json
from pathlib import Path

from playwright.sync_api import expect

from tests.agent.server import wait_until
from tests.control_plane.console.conftest import Console, Fleet
from tests.control_plane.test_rollouts import served


def test_an_operator_asks_for_a_bundle_and_downloads_it(
    operator_console: Console, viewer_console: Console, fleet: Fleet, tmp_path: Path
) -> None:
    page = operator_console.go("/ui/devices/dev-a")
    section = page.locator(
        "section", has=page.get_by_role("heading", name="Logs and support bundle")
    )
    page.get_by_role("button", name="Ask for a support bundle").click()
    expect(section).to_contain_text("support-bundle")
    page.get_by_label("Level at least").select_option("WARNING")
    page.get_by_role("button", name="Ask for logs").click()
    expect(section.get_by_role("row").nth(1)).to_contain_text("logs")
    link = section.get_by_role("link", name="Download")

    def both_answered() -> bool:
        operator_console.go("/ui/devices/dev-a")
        return link.count() == 2

    wait_until(both_answered, timeout_s=60, what="both answers on the device page")
    expect(section.get_by_role("row").nth(1)).to_contain_text("logs")  # the newest first
    with page.expect_download() as download:
        link.last.click()  # the bundle, asked first
    bundle = json.loads(Path(download.value.path()).read_bytes())
    # the package's fleet is shared: other console tests roll dev-a forward, so the bundle must
    # name whatever version dev-a serves now, not the one it started on
    now = {"model": "mlp", "versions": [int(served(fleet.agents["dev-a"]))]}
    assert bundle["device_id"] == "dev-a" and now in bundle["served"], bundle["served"]
    assert download.value.suggested_filename.startswith("dev-a-support-bundle-")
    href = link.last.get_attribute("href")
    assert href is not None

    page = viewer_console.go("/ui/devices/dev-a")
    expect(page.get_by_role("heading", name="Device dev-a")).to_be_visible()
    expect(page.get_by_role("heading", name="Logs and support bundle")).to_have_count(0)
    expect(page.get_by_role("button", name="Ask for logs")).to_have_count(0)
    refused = page.request.get(f"{fleet.cp.url}{href}")
    assert refused.status == 403, refused.text()
