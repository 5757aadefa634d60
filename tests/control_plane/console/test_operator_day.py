"""The console's operator pages in Debian's headless Chromium, against the shared fleet:
a claim whose token is shown once, a device that presented it approved, a deployment created,
moved to another version and deleted, a maintenance window previewed and created, and a viewer
who sees every one of these pages with no action button. Windows and deployments that could
hold or move the fleet's agents select no device, except the one that checks compliance on
the version its device already serves."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import expect

from common.protocol.enrolment import ENROL_PATH
from common.protocol.messages import ModelTelemetry, Telemetry
from runtimes.examples.variants import mlp_version
from tests.access.mqtt_client import ProbeClient
from tests.control_plane.console.conftest import Console, Fleet
from tests.control_plane.test_mlflow_source import MlflowStore, filled_store
from tests.control_plane.test_rollouts import rollout, served, wait_rollout

pytestmark = pytest.mark.slow


def enrol(fleet: Fleet, token: str, device_id: str) -> httpx.Response:
    """A device presenting its claim, as the agent's enrolment does (its first request)."""
    body = {"device_id": device_id, "device_key": "k" * 40, "hardware_profile": "raspberry-pi-5"}
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.post(fleet.cp.url + ENROL_PATH, json=body, headers=headers, timeout=30)


def test_a_claims_token_is_shown_once_and_its_device_is_approved(
    operator_console: Console, fleet: Fleet
) -> None:
    page = operator_console.go("/ui/claims")
    page.get_by_label(re.compile("^Name")).fill("line-3")
    page.get_by_label("Labels every device gets").fill("site=plant-3")
    page.get_by_label("Devices it may enrol").fill("2")
    page.get_by_label("Devices wait for an operator's approval").check()
    page.get_by_role("button", name="Create the claim").click()
    token = page.locator("#claim-token").text_content() or ""
    assert token.startswith("efc_")
    row = page.locator("#claims tr", has_text="line-3")
    expect(row.locator(".uses-left")).to_have_text("2 of 2")
    operator_console.shot("claim-created")
    page = operator_console.go("/ui/claims")  # the token is on the answer's page alone
    expect(page.locator("#claims")).to_contain_text("line-3")
    expect(page.locator("#new-token")).to_have_count(0)
    assert token not in page.content()

    assert enrol(fleet, token, "dev-new").status_code == 202  # pending: waits for approval
    page = operator_console.go("/ui/enrolments")
    pending = page.locator("#pending tr", has_text="dev-new")
    expect(pending).to_contain_text("raspberry-pi-5")
    operator_console.shot("enrolments")
    page.get_by_role("button", name="Approve dev-new").click()
    expect(page.locator("#pending")).to_contain_text("No device is waiting.")
    expect(page.locator("#decided tr", has_text="dev-new")).to_contain_text("approved")

    page = operator_console.go("/ui/claims")
    page.get_by_role("link", name="Revoke line-3").click()
    expect(page.get_by_role("heading", name=re.compile("Revoke claim"))).to_be_visible()
    page.get_by_role("button", name="Revoke the claim").click()
    expect(page.locator("#claims tr", has_text="line-3")).to_contain_text("revoked")


def no_active_rollout(fleet: Fleet) -> None:
    """Cancel another module's rollout still baking: it holds the devices this test moves."""
    for r in fleet.cp.admin.get("/api/v1/rollouts").json():
        if r["state"] in ("running", "paused"):
            fleet.cp.admin.post(f"/api/v1/rollouts/{r['id']}/cancel").raise_for_status()


def create_deployment(page_console: Console, name: str, version: str, selector: str) -> None:
    page = page_console.go("/ui/deployments")
    page.get_by_label(re.compile("^Name")).fill(name)
    page.get_by_label("Model", exact=True).select_option("mlp")
    page.get_by_label("Version", exact=True).fill(version)
    page.get_by_label("Label selector").fill(selector)
    page.get_by_label("Pass a wave the gates could not judge").check()
    page.get_by_role("button", name="Create the deployment").click()
    expect(page).to_have_url(re.compile(f"/ui/deployments/{name}$"))


def delete_deployment(page_console: Console, name: str) -> None:
    page = page_console.go(f"/ui/deployments/{name}")
    page.get_by_role("link", name="Delete").click()
    page.get_by_role("button", name="Delete the deployment").click()
    expect(page).to_have_url(re.compile("/ui/deployments$"))
    expect(page.locator("#deployments")).not_to_contain_text(name)


def test_a_deployment_shows_compliance_changes_version_and_is_deleted(
    operator_console: Console, fleet: Fleet
) -> None:
    # on the version dev-b serves: in compliance with no rollout to wait for (v1, which
    # the agents start on, was never validated: a module run alone moves it to v2 first)
    no_active_rollout(fleet)
    if served(fleet.agents["dev-b"]) not in ("2", "3"):
        wait_rollout(fleet.cp, rollout(fleet.cp, 2, selector={"group": "pi"}), "succeeded")
    create_deployment(operator_console, "pi-keep", served(fleet.agents["dev-b"]), "group=pi")
    page = operator_console.page
    expect(page.locator("#compliance")).to_contain_text("1 of 1 devices in compliance")
    expect(page.get_by_role("row", name=re.compile("dev-b"))).to_contain_text("compliant")
    operator_console.shot("deployment")
    page = operator_console.go("/ui/deployments")
    expect(page.locator("#deployments tr", has_text="pi-keep")).to_contain_text("1 of 1")
    delete_deployment(operator_console, "pi-keep")

    create_deployment(operator_console, "nowhere", "2", "site=nowhere")
    page = operator_console.page
    # paused: it says who holds it, and the button lets it go on
    page.get_by_role("button", name="Pause the deployment").click()
    expect(page.locator("#paused")).to_contain_text("Paused by ")
    assert fleet.cp.admin.get("/api/v1/deployments/nowhere").json()["paused"] is True
    page.get_by_role("button", name="Resume the deployment").click()
    expect(page.locator("#paused")).to_have_count(0)
    assert fleet.cp.admin.get("/api/v1/deployments/nowhere").json()["paused"] is False
    page.get_by_label("Change the version to").select_option("3")
    page.get_by_role("button", name="Change the version").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Deployment nowhere: mlp v3")
    create = operator_console.go("/ui/deployments")
    create.get_by_label(re.compile("^Name")).fill("nowhere")
    create.get_by_label("Version", exact=True).fill("2")
    create.get_by_role("button", name="Create the deployment").click()
    expect(create.get_by_role("alert")).to_contain_text("409: deployment 'nowhere' exists")
    refused = [e for e in operator_console.errors if "status of 409" in e]
    assert len(refused) == 1
    operator_console.errors.remove(refused[0])  # the one refusal this test asked for
    delete_deployment(operator_console, "nowhere")


def test_a_window_previews_its_next_openings_and_is_created(
    operator_console: Console,
) -> None:
    page = operator_console.go("/ui/windows")
    page.get_by_label(re.compile("^Name")).fill("weeknights")
    page.get_by_label("Opens at").fill("61 2 * * 1-5")
    expect(page.locator("#openings")).to_contain_text("cron minute '61': outside 0-59")
    page.get_by_label("Opens at").fill("30 2 * * 1-5")
    page.get_by_label("Time zone").fill("Europe/Paris")
    openings = page.locator("#openings li")
    expect(openings).to_have_count(5)
    # local time first, weekdays only, then UTC: an hour behind in winter, two in summer
    first = openings.first
    expect(first).to_contain_text(
        re.compile(r"(Mon|Tue|Wed|Thu|Fri) \S+ 02:30 (CET \(01|CEST \(00):30 UTC\)")
    )
    page.get_by_label("Label selector").fill("site=nowhere")  # it holds none of the agents
    operator_console.shot("window-new")
    page.get_by_role("button", name="Create the window").click()
    row = page.locator("#windows tr", has_text="weeknights")
    expect(row).to_contain_text("30 2 * * 1-5")
    expect(row).to_contain_text("Europe/Paris")
    page.get_by_role("link", name="Delete weeknights").click()
    page.get_by_role("button", name="Delete the window").click()
    expect(page.locator("#windows")).not_to_contain_text("weeknights")


@pytest.fixture
def something_to_act_on(fleet: Fleet) -> Iterator[None]:
    """A deployment, a window, a claim and a pending device: each page has its actions."""
    admin = fleet.cp.admin
    deployment = {"name": "for-viewer", "model": "mlp", "version": 2, "selector": {"x": "y"}}
    admin.post("/api/v1/deployments", json=deployment).raise_for_status()
    window = {"name": "for-viewer", "cron": "0 3 * * *", "duration_s": 60, "selector": {"x": "y"}}
    admin.post("/api/v1/maintenance-windows", json=window).raise_for_status()
    claim = admin.post("/api/v1/claims", json={"name": "for-viewer", "require_approval": True})
    assert enrol(fleet, claim.json()["token"], "dev-waiting").status_code == 202
    yield
    admin.post("/api/v1/enrolments/dev-waiting/reject", json={}).raise_for_status()
    admin.post(f"/api/v1/claims/{claim.json()['id']}/revoke").raise_for_status()
    admin.delete("/api/v1/maintenance-windows/for-viewer").raise_for_status()
    admin.delete("/api/v1/deployments/for-viewer").raise_for_status()


VIEWER_PAGES = [
    "/ui/devices/dev-a",
    "/ui/models/mlp/versions/3",
    "/ui/deployments",
    "/ui/deployments/for-viewer",
    "/ui/deployments/for-viewer/confirm/delete",
    "/ui/windows",
    "/ui/windows/for-viewer/confirm/delete",
    "/ui/claims",
    "/ui/enrolments",
    "/ui/enrolments/dev-waiting/confirm/reject",
    "/ui/costs",
    "/ui/keys",
    "/ui/models",
    "/ui/models/new",
]


@pytest.mark.usefixtures("something_to_act_on")
def test_a_viewer_sees_these_pages_with_no_action_button(
    viewer_console: Console, operator_console: Console
) -> None:
    # the operator is offered an action on each page: the viewer's lack of them is its role
    for path in VIEWER_PAGES:
        page = operator_console.go(path)
        expect(page.locator("main button, main a.button").first).to_be_visible()
    for path in VIEWER_PAGES:
        page = viewer_console.go(path)
        expect(page.locator("main h1")).to_be_visible()
        expect(page.locator("main")).not_to_contain_text("Refused")
        expect(page.locator("main button, main a.button")).to_have_count(0)
    page = viewer_console.go("/ui/enrolments")
    expect(page.locator("#pending")).to_contain_text("dev-waiting")  # it sees, it cannot act
    page = viewer_console.go("/ui/claims")
    expect(page.locator(".note")).to_contain_text("Claims are listed to operators only")


def test_the_overview_leads_with_a_rollback_and_links_to_it(
    operator_console: Console, fleet: Fleet
) -> None:
    no_active_rollout(fleet)
    rollout_id = rollout(fleet.cp, 3, selector={"group": "pi"}, bake_time_s=60)
    fleet.cp.admin.post(f"/api/v1/rollouts/{rollout_id}/abort").raise_for_status()
    wait_rollout(fleet.cp, rollout_id, "rolled_back")
    page = operator_console.go("/ui/")
    alert = page.locator("#attention").get_by_role("link", name=f"Rollout #{rollout_id} of mlp v3")
    expect(alert).to_contain_text("rolled back")
    operator_console.shot("overview-attention")
    alert.click()
    expect(page).to_have_url(re.compile(f"/ui/rollouts/{rollout_id}$"))
    expect(page.locator("#rollout-state")).to_have_text("rolled back")


def test_a_shadow_rollout_from_the_form_shows_its_phase(
    operator_console: Console, fleet: Fleet
) -> None:
    no_active_rollout(fleet)
    page = operator_console.go("/ui/rollouts/new")
    page.get_by_label("Model", exact=True).select_option("mlp")
    page.get_by_label("Version", exact=True).fill("3")
    page.get_by_label("Label selector").fill("group=pi")
    page.get_by_label("Waves").fill("100%")
    page.get_by_label("Share of requests to copy").fill("0.5")
    # more than this test sends: the phase stays running, to be read, then cancelled
    page.get_by_label("Fewest shadowed requests to judge").fill("100000")
    page.get_by_label("Largest input drift, PSI").fill("0.2")
    page.get_by_role("button", name="Start the rollout").click()
    # the API's refusal on the form, every value kept: v3 has no reference set for drift
    expect(page.get_by_role("alert")).to_contain_text("400: gates.max_drift: mlp")
    expect(page.get_by_label("Share of requests to copy")).to_have_value("0.5")
    refused = [e for e in operator_console.errors if "status of 400" in e]
    assert len(refused) == 1
    operator_console.errors.remove(refused[0])  # the one refusal this test asked for
    page.get_by_label("Largest input drift, PSI").fill("")
    page.get_by_label("Devices that may refuse or roll back").fill("1")
    page.get_by_role("button", name="Start the rollout").click()
    expect(page).to_have_url(re.compile(r"/ui/rollouts/\d+$"))
    rollout_id = int(page.url.rsplit("/", 1)[1])
    try:
        wave = page.locator(".wave").first
        expect(wave.get_by_role("heading", level=3)).to_contain_text("Wave 0")
        expect(wave.locator(".shadow")).to_contain_text(
            re.compile(r"shadow running: \d+ shadowed requests \(min 100000\)"), timeout=30_000
        )
        operator_console.shot("rollout-shadow")
        doc = fleet.cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
        assert doc["gates"]["max_rejections"] == 1 and doc["shadow"]["spec"]["sample_share"] == 0.5
    finally:
        fleet.cp.admin.post(f"/api/v1/rollouts/{rollout_id}/cancel").raise_for_status()


def test_a_devices_operator_labels_are_set_and_removed(operator_console: Console) -> None:
    page = operator_console.go("/ui/devices/dev-a")
    page.get_by_label("Set operator labels").fill("line=3, cell=a")
    page.get_by_role("button", name="Set labels").click()
    labels = page.locator("#labels")
    expect(labels).to_contain_text("line=3 (operator)")
    expect(labels).to_contain_text("cell=a (operator)")
    expect(labels).to_contain_text("site=lab")  # what the device reports stays
    page.get_by_role("button", name="Remove label line").click()
    expect(labels).not_to_contain_text("line=3")
    page.get_by_role("button", name="Remove label cell").click()
    expect(labels).not_to_contain_text("(operator)")
    page = operator_console.go("/ui/devices?label=cell%3Da")
    expect(page.get_by_text("No device matches.")).to_be_visible()


def test_a_versions_stage_is_changed_from_its_page(operator_console: Console) -> None:
    page = operator_console.go("/ui/models/mlp/versions/3")
    before = page.locator("h1 .stage").text_content() or ""
    page.get_by_label("Stage", exact=True).select_option("production")
    page.get_by_role("button", name="Set the stage").click()
    expect(page.locator("h1 .stage")).to_have_text("production")
    page = operator_console.go("/ui/models")
    row = page.get_by_role("row", name=re.compile(r"^v3 "))
    expect(row).to_contain_text("production")
    page = operator_console.go("/ui/models/mlp/versions/3")
    page.get_by_label("Stage", exact=True).select_option(before)
    page.get_by_role("button", name="Set the stage").click()
    expect(page.locator("h1 .stage")).to_have_text(before)


def test_a_devices_presence_updates_without_a_reload(operator_console: Console) -> None:
    page = operator_console.go("/ui/devices/dev-a")
    presence = page.locator("#presence")
    expect(presence.locator(".pill")).to_have_text("online")
    first = page.locator("#last-seen").text_content() or ""
    # the agent's telemetry moves its last contact; the part re-reads it (htmx), no reload
    expect(page.locator("#last-seen")).not_to_have_text(first, timeout=15_000)
    expect(presence.locator(".pill")).to_have_text("online")


def test_a_selection_of_devices_is_labelled_from_the_list(operator_console: Console) -> None:
    page = operator_console.go("/ui/devices")
    page.get_by_label("Select dev-a").check()
    page.get_by_label("Select dev-b").check()
    page.get_by_label("Operator labels for the selected devices").fill("line=7")
    page.get_by_role("button", name="Label the selected").click()
    expect(page).to_have_url(re.compile(r"/ui/devices\?label=line%3D7$"))
    expect(page.locator("#count")).to_have_text("2 devices")
    page.get_by_label("Select dev-a").check()
    page.get_by_label("Select dev-b").check()
    page.get_by_label("Operator labels for the selected devices").fill("line=")  # removes
    page.get_by_role("button", name="Label the selected").click()
    page = operator_console.go("/ui/devices?label=line%3D7")
    expect(page.get_by_text("No device matches.")).to_be_visible()


def test_a_versions_page_shows_its_cost(operator_console: Console) -> None:
    # mlp v3 is in the registry and served nowhere: nothing priced to show
    page = operator_console.go("/ui/models/mlp/versions/3")
    cost = page.locator("section", has=page.get_by_role("heading", name="Cost"))
    expect(cost).to_contain_text("No priced predictions in the last hour")
    accuracy = page.locator("section", has=page.get_by_role("heading", name="Live accuracy"))
    expect(accuracy).to_contain_text("No outcomes posted in the last hour")


def noisy_windows(fleet: Fleet, p99s: tuple[float, ...]) -> None:
    """dev-a's telemetry of mlp v1 with these p99s, a second apart (the control plane's clock
    slices them), each of many requests so the agent's own idle windows weigh nothing."""
    port = urlsplit(fleet.cp.services.settings.mqtt_url).port
    assert port is not None
    device = ProbeClient(port)
    assert device.connect() == 0
    try:
        for i, p99 in enumerate(p99s):
            model = ModelTelemetry(
                model="mlp",
                version=1,
                requests=10_000,
                errors=0,
                rows=10_000,
                batches=100,
                p99_ms=p99,
            )
            message = Telemetry(
                device_id="dev-a",
                seq=10**9 + i,
                time=datetime.now(UTC),
                window_s=1.0,
                models=[model],
            )
            info = device.client.publish(
                "edgefleet/devices/dev-a/telemetry", message.model_dump_json(), qos=1
            )
            info.wait_for_publish(timeout=10)
            time.sleep(1.1)  # pacing: the next window in the next one-second slice
    finally:
        device.close()


def test_the_rollout_form_warns_when_p99_noise_would_trip_the_gate(
    operator_console: Console, fleet: Fleet
) -> None:
    noisy_windows(fleet, (5.0, 5.0, 50.0))
    noise = fleet.cp.admin.get(
        "/api/v1/models/mlp/p99-noise", params={"label": "group=x86", "bake_time_s": 1}
    ).json()
    assert (noise["version"], noise["devices"]) == (1, 1) and noise["slices"] >= 3, noise
    # 50 ms against the three windows' 20: 2.5 (the agent's own windows of mlp v1, from the
    # traffic of other tests in the hour, weigh little beside 10,000 requests each)
    assert 2.0 < noise["worst_ratio"] < 3.5, noise
    page = operator_console.go("/ui/rollouts/new")
    page.get_by_label(re.compile("^Label selector")).fill("group=x86")
    page.get_by_label("Bake time per wave (s)").fill("1")
    warning = page.locator("#noise .warning")
    expect(warning).to_contain_text("The p99 gate may trip on noise alone: mlp v1")
    expect(warning).to_contain_text("against a limit of 2x")
    page.get_by_label("Largest p99 ratio to production").fill("4")  # far above the swings
    expect(warning).to_have_count(0)


def test_cost_rates_are_set_from_their_page(operator_console: Console, fleet: Fleet) -> None:
    page = operator_console.go("/ui/costs")
    rates = page.get_by_label(re.compile("^Every rate, one a line"))
    rates.fill("label group=x86 0.5\nprofil x86 1")
    page.get_by_role("button", name="Set the rates").click()
    expect(page.get_by_role("alert")).to_contain_text("line 2: 'default PER_HOUR'")
    expect(rates).to_have_value("label group=x86 0.5\nprofil x86 1")  # kept to mend
    refused = [e for e in operator_console.errors if "status of 400" in e]
    assert len(refused) == 1
    operator_console.errors.remove(refused[0])
    rates.fill("default 0.1\nlabel group=x86 0.5  # the lab's boxes")
    page.get_by_role("button", name="Set the rates").click()
    expect(page.locator("#rates")).to_contain_text("label group=x86")
    expect(page.locator("#rates")).to_contain_text("every other device")
    assert fleet.cp.admin.get("/api/v1/cost-rates").json()["rates"] == [
        {"per_hour": 0.1, "updated_by": "bootstrap-admin"},
        {"per_hour": 0.5, "label": "group=x86", "updated_by": "bootstrap-admin"},
    ]
    fleet.cp.admin.put("/api/v1/cost-rates", json={"rates": []}).raise_for_status()


def test_the_keys_page_shows_the_trust_root_and_offers_rotation(
    operator_console: Console, fleet: Fleet
) -> None:
    trust = fleet.cp.admin.get("/api/v1/keys").json()
    page = operator_console.go("/ui/keys")
    signing = page.get_by_role("row", name=re.compile(trust["signing_key"]))
    expect(signing).to_contain_text("signing")
    expect(signing.get_by_role("link", name=re.compile("^Revoke"))).to_have_count(0)
    page.get_by_role("link", name="Rotate the manifest key").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Rotate the manifest key?")
    expect(page.get_by_role("button", name="Rotate the key")).to_be_visible()
    # not rotated here: the package's devices go on verifying with the key they hold


def test_a_version_is_validated_and_an_unfinished_push_discarded(
    operator_console: Console, fleet: Fleet
) -> None:
    page = operator_console.go("/ui/models/mlp/versions/3")
    page.get_by_role("button", name="Validate").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("mlp v3")
    expect(page.get_by_role("button", name="Build the variants")).to_be_visible()
    spec = {"version": 9, "variants": [{"format": "onnx", "profiles": []}]}
    fleet.cp.admin.post("/api/v1/models/mlp/versions", json=spec).raise_for_status()
    page = operator_console.go("/ui/models/mlp/versions/9")
    page.get_by_role("link", name="Discard the unfinished push").click()
    page.get_by_role("button", name="Discard the push").click()
    page.wait_for_url(re.compile("/ui/models$"))
    assert fleet.cp.admin.get("/api/v1/models/mlp/versions/9").status_code == 404


def test_a_version_is_pushed_from_the_browser_and_validated(
    operator_console: Console, fleet: Fleet, tmp_path: Path
) -> None:
    made = mlp_version(tmp_path / "upload", seed=7)
    page = operator_console.go("/ui/models")
    page.get_by_role("link", name="Push a new version").click()
    page.get_by_label("Model name").fill("uploaded")
    page.get_by_label("Version number").fill("1")
    page.get_by_label("Files", exact=True).set_input_files(
        [str(made / "golden.npz")]
    )  # no model file
    page.get_by_role("button", name="Push the version").click()
    expect(page.get_by_role("alert")).to_contain_text("400: files: ")
    refused = [e for e in operator_console.errors if "status of 400" in e]
    assert len(refused) == 1
    operator_console.errors.remove(refused[0])
    assert fleet.cp.admin.get("/api/v1/models/uploaded/versions/1").status_code == 404
    page.get_by_label("Files", exact=True).set_input_files(
        [str(made / "model.onnx"), str(made / "golden.npz")]
    )
    page.get_by_role("button", name="Push the version").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("uploaded v1")
    doc = fleet.cp.admin.get("/api/v1/models/uploaded/versions/1").json()
    assert doc["complete"] and doc["golden"] is not None, doc
    (variant,) = doc["variants"]
    stored = {f["name"]: f["sha256"] for f in variant["files"]}
    assert stored["model.onnx"] == hashlib.sha256((made / "model.onnx").read_bytes()).hexdigest()
    page.get_by_role("button", name="Validate").click()
    expect(page.locator("main")).to_contain_text("golden")


@pytest.fixture
def flow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MlflowStore]:
    with filled_store(tmp_path / "mlflow", monkeypatch) as store:
        yield store


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")
@pytest.mark.filterwarnings("ignore::UserWarning:mlflow.*")
def test_an_mlflow_alias_is_pushed_from_the_browser_as_the_next_version(
    operator_console: Console,
    fleet: Fleet,
    flow_store: MlflowStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``models sync``'s one check from the console: the control plane (in this process)
    resolves the URI against its MLFLOW_TRACKING_URI, a real MLflow store on SQLite."""
    mlflow_store = flow_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store.uri)
    page = operator_console.go("/ui/models/new")

    def sync(uri: str) -> None:
        page.get_by_label("Push it as model").fill("flow")
        page.get_by_label("MLflow model URI").fill(uri)
        page.get_by_role("button", name="Push what it points at").click()

    sync("models:/nowhere@champion")
    expect(page.get_by_role("alert")).to_contain_text("400: source: models:/nowhere@champion")
    refused = [e for e in operator_console.errors if "status of 400" in e]
    assert len(refused) == 1
    operator_console.errors.remove(refused[0])
    sync("models:/digits@champion")
    expect(page.get_by_role("heading", level=1)).to_contain_text("flow v1")
    doc = fleet.cp.admin.get("/api/v1/models/flow/versions/1").json()
    assert doc["complete"] and doc["validation"] is not None, doc
    assert (doc["source"]["registered_model"], doc["source"]["version"]) == ("digits", 1)
    assert doc["source"]["run_id"] == mlflow_store.run_ids[1]
    page = operator_console.go("/ui/models/new")
    sync("models:/digits@champion")  # nothing new: said, and nothing pushed
    expect(page.get_by_role("status")).to_contain_text("flow is up to date: v1 is")
    assert fleet.cp.admin.get("/api/v1/models/flow/versions/2").status_code == 404
    mlflow_store.client.set_registered_model_alias("digits", "champion", "2")
    sync("models:/digits@champion")
    expect(page.get_by_role("heading", level=1)).to_contain_text("flow v2")
    doc = fleet.cp.admin.get("/api/v1/models/flow/versions/2").json()
    assert (doc["source"]["version"], doc["source"]["run_id"]) == (2, mlflow_store.run_ids[2])
