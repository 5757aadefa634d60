"""The console in Debian's headless Chromium, against a real control plane and real agents:
log in, see every device, create a rollout from the form and watch its waves complete, abort
another, and a viewer sees no action button. Each test leaves a screenshot in docs/console/."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.agent.server import wait_until
from tests.control_plane.console.conftest import Console, Fleet
from tests.control_plane.test_rollouts import infer, rollout, served, wait_rollout

pytestmark = pytest.mark.slow


def test_login_then_the_overview_counts_every_device(operator_console: Console) -> None:
    page = operator_console.go("/ui/")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.locator(".totals .pill.online")).to_have_text("2 online")
    profiles = page.locator("table", has=page.locator("caption", has_text="By hardware profile"))
    expect(profiles.get_by_role("row", name=re.compile("raspberry-pi-5"))).to_be_visible()
    labels = page.locator("table", has=page.locator("caption", has_text="By label"))
    expect(labels.get_by_role("row", name=re.compile("site=lab"))).to_contain_text("2")
    versions = page.locator("section", has=page.get_by_role("heading", name="Versions running"))
    expect(versions.get_by_role("row", name=re.compile(r"mlp\s+v1"))).to_contain_text("2")
    operator_console.shot("overview")


def test_devices_filter_on_the_server_and_a_device_shows_its_facts(
    operator_console: Console,
) -> None:
    page = operator_console.go("/ui/devices")
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(2)
    expect(page.get_by_role("link", name="dev-a")).to_be_visible()
    expect(page.get_by_role("link", name="dev-b")).to_be_visible()
    operator_console.shot("devices")
    page.get_by_label("Hardware profile").select_option("raspberry-pi-5")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"profile=raspberry-pi-5"))
    expect(rows).to_have_count(1)
    expect(page.get_by_role("link", name="dev-b")).to_be_visible()
    page.get_by_label("Model version").fill("mlp:9")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_text("No device matches.")).to_be_visible()
    page = operator_console.go("/ui/devices/dev-b")
    facts = page.locator("dl").first
    expect(facts).to_contain_text("raspberry-pi-5")
    expect(facts).to_contain_text(re.compile(r"Trust root version\s*1"))
    expect(page.locator("section", has_text="Served models")).to_contain_text("mlp v1")
    expect(page.locator("dl", has_text="Messages dropped")).to_contain_text("CPU")
    operator_console.shot("device")


def test_models_show_versions_stages_artifacts_and_validation(operator_console: Console) -> None:
    page = operator_console.go("/ui/models")
    expect(page.get_by_role("link", name="v3")).to_be_visible()
    operator_console.shot("models")
    page.get_by_role("link", name="v2").click()
    expect(page.get_by_role("heading", name=re.compile("mlp v2"))).to_be_visible()
    expect(page.locator("section", has_text="Artifacts per profile")).to_contain_text("model.onnx")
    validation = page.locator("section", has_text="Validation")
    expect(validation).to_contain_text("Passed")
    expect(validation).to_contain_text("golden self-test")
    operator_console.shot("model-version")


def test_a_rollout_created_from_the_form_runs_its_waves_to_the_end(
    operator_console: Console, fleet: Fleet
) -> None:
    page = operator_console.go("/ui/rollouts")
    page.get_by_role("link", name="New rollout").click()
    page.get_by_label("Model", exact=True).select_option("mlp")
    page.get_by_label("Version").fill("2")
    page.get_by_label("Label selector").fill("site=lab")
    expect(page.locator("#preview")).to_contain_text("2 devices match")
    page.get_by_label("raspberry-pi-5").check()
    expect(page.locator("#preview")).to_contain_text("1 devices match")
    page.get_by_label("raspberry-pi-5").uncheck()
    expect(page.locator("#preview")).to_contain_text("2 devices match")
    for _ in range(
        3
    ):  # quick toggles: the last answer is the one shown, whatever order they come in
        page.get_by_label("raspberry-pi-5").check()
        page.get_by_label("raspberry-pi-5").uncheck()
    page.wait_for_load_state("networkidle")
    expect(page.locator("#preview")).to_contain_text("2 devices match")
    page.get_by_label("Waves").fill("1, 100%")
    page.get_by_label("Bake time per wave (s)").fill("0.5")
    page.get_by_label("Pass a wave the gates could not judge").check()
    operator_console.shot("rollout-new")
    page.get_by_role("button", name="Start the rollout").click()
    expect(page).to_have_url(re.compile(r"/ui/rollouts/\d+$"))
    # the progress part refreshes itself (htmx) until the rollout ends: no reload here
    expect(page.locator("#rollout-state")).to_have_text("succeeded", timeout=60_000)
    expect(page.locator(".actions")).to_have_count(0)  # a finished rollout offers none
    waves = page.locator(".wave")
    expect(waves).to_have_count(2)
    for i in range(2):
        expect(waves.nth(i).locator(".wave-states")).to_have_text("committed 1")
    operator_console.shot("rollout")
    assert served(fleet.agents["dev-a"]) == "2" and served(fleet.agents["dev-b"]) == "2"


def test_abort_another_rollout_with_a_confirmation(operator_console: Console, fleet: Fleet) -> None:
    rollout_id = rollout(fleet.cp, 3, bake_time_s=60)
    wait_until(lambda: served(fleet.agents["dev-a"]) == "3", what="wave 1 of the rollout of v3")
    page = operator_console.go(f"/ui/rollouts/{rollout_id}")
    expect(page.locator("#rollout-state")).to_have_text("running")
    expect(page.locator(".wave.current .verdict")).to_contain_text("gates")
    page.get_by_role("link", name="Abort and roll back").click()
    expect(
        page.get_by_role("heading", name=f"Abort and roll back rollout #{rollout_id}?")
    ).to_be_visible()
    operator_console.shot("rollout-confirm")
    page.get_by_role("button", name="Abort and roll back").click()
    expect(page.locator("#rollout-state")).to_have_text("rolled back", timeout=60_000)
    expect(page.locator("#progress")).to_contain_text("aborted by")
    assert wait_rollout(fleet.cp, rollout_id, "rolled_back")["state"] == "rolled_back"
    wait_until(lambda: served(fleet.agents["dev-a"]) == "2", what="dev-a back on v2")


def test_a_viewer_sees_everything_and_no_action_button(
    viewer_console: Console, operator_console: Console, fleet: Fleet
) -> None:
    rollout_id = rollout(fleet.cp, 3, bake_time_s=60)
    fleet.cp.admin.post(f"/api/v1/rollouts/{rollout_id}/pause").raise_for_status()
    try:
        # the same page shows an operator its actions: the viewer's lack of them is its role
        page = operator_console.go(f"/ui/rollouts/{rollout_id}")
        expect(page.get_by_role("link", name="Resume")).to_be_visible()
        page = viewer_console.go(f"/ui/rollouts/{rollout_id}")
        expect(page.locator("#rollout-state")).to_have_text("paused")
        expect(page.locator(".actions")).to_have_count(0)
        expect(page.get_by_role("button")).to_have_text(["Log out"])
        viewer_console.shot("rollout-viewer")
        for path in ("/ui/", "/ui/devices", "/ui/devices/dev-a", "/ui/models", "/ui/rollouts"):
            page = viewer_console.go(path)
            expect(page.locator("main")).not_to_contain_text("Refused")
            expect(page.locator("main a.button, main button")).to_have_count(
                1 if path == "/ui/devices" else 0  # the filter form's own button
            )
        # by its URL, the form and the confirmation say what role they need, with no button
        for path in ("/ui/rollouts/new", f"/ui/rollouts/{rollout_id}/confirm/abort"):
            page = viewer_console.go(path)
            expect(page.locator(".note")).to_contain_text("needs the operator role")
            expect(page.locator("main button, main a.button")).to_have_count(0)
    finally:
        fleet.cp.admin.post(f"/api/v1/rollouts/{rollout_id}/cancel").raise_for_status()


def test_telemetry_charts_update_live(operator_console: Console, fleet: Fleet) -> None:
    for agent in fleet.agents.values():
        for _ in range(20):
            assert infer(agent).status_code == 200
    page = operator_console.go("/ui/telemetry")
    card = page.locator(".chart-card", has=page.get_by_role("heading", name="mlp v2"))
    expect(card.locator(".uplot")).to_have_count(3)
    latest = card.locator(".latest")
    expect(latest).to_contain_text("req/s", timeout=15_000)
    first = latest.text_content()
    for agent in fleet.agents.values():
        for _ in range(20):
            assert infer(agent).status_code == 200
    # a new point arrives over server-sent events without a reload
    expect(latest).not_to_have_text(first or "", timeout=15_000)
    operator_console.shot("telemetry")
