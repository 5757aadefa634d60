"""``edgefleet devices``: the device inventory, for operators (through the API)."""

from __future__ import annotations

from typing import Any

import click

from control_plane.cli.api_client import Api, connected
from control_plane.cli.device_logs import logs, support_bundle
from control_plane.cli.io import json_document_option, key_values, print_doc
from control_plane.cli.twins import device_twin
from control_plane.device_view import device_lines


@click.group("devices")
def devices() -> None:
    """The device inventory."""


@click.command("list")
@click.option("--label", multiple=True, help="key=value (repeatable)")
@click.option("--profile")
@click.option(
    "--online/--offline",
    default=None,
    help="online: its last status says so and it was heard from lately",
)
@click.option("--silent", is_flag=True, help="only devices online by status but silent")
@click.option(
    "--trust-root-version",
    type=click.IntRange(min=1),
    help="only devices that hold this trust root version",
)
@json_document_option
@connected
def list_devices(
    label: tuple[str, ...],
    profile: str | None,
    online: bool | None,
    silent: bool,
    trust_root_version: int | None,
    as_json: bool,
) -> None:
    """Devices, filtered by labels, profile, presence (online, offline, or silent: online
    by its last status, but nothing heard from it for longer than its limit) and the trust
    root version they hold (shown as root N; root ? for an agent that does not say)."""
    key_values(label, "--label", "key=value")
    params: dict[str, Any] = {"label": list(label)}
    if profile:
        params["profile"] = profile
    if trust_root_version is not None:
        params["trust_root_version"] = trust_root_version
    if online is not None:
        params["online"] = str(online).lower()
    if silent:
        params["presence"] = "silent"
    doc = Api.connect().call("GET", "/api/v1/devices", params=params)
    if as_json:
        print_doc(doc, True)
        return
    for d in doc:
        served = ", ".join(f"{m['model']} v{m['version']}" for m in d["models"])
        labels = ",".join(f"{k}={v}" for k, v in sorted(d["labels"].items()))
        root = d["trust_root_version"] or "?"
        click.echo(
            f"{d['id']:<20} {d['presence']:<7} "
            f"{d['hardware_profile'] or '?':<20} root {root:<3} "
            f"{labels:<30} {served}"
        )


@click.command("show")
@click.argument("device_id")
@json_document_option
@connected
def show_device(device_id: str, as_json: bool) -> None:
    """One device: presence, agent and trust root versions, labels, the models it serves
    and its last telemetry (sequence, CPU, memory, messages it dropped)."""
    from urllib.parse import quote

    # quoted: an id with "/", "?" or "#" would name another route
    doc = Api.connect().call("GET", f"/api/v1/devices/{quote(device_id, safe='')}")
    print_doc(doc if as_json else "\n".join(device_lines(doc)), as_json)


@click.command("label")
@click.argument("device_id")
@click.argument("labels", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the device's document.")
@connected
def label(device_id: str, labels: tuple[str, ...], as_json: bool) -> None:
    """Set operator labels (key=value), or remove one (key=)."""
    pairs = key_values(labels, "LABELS", "key=value, or key= to remove it")
    changes = {k: (v or None) for k, v in pairs.items()}
    doc = Api.connect().call(
        "PATCH", f"/api/v1/devices/{device_id}/labels", json={"labels": changes}
    )
    own = ",".join(f"{k}={v}" for k, v in sorted(doc["operator_labels"].items()))
    print_doc(doc if as_json else f"{doc['id']}: operator labels {own or 'none'}", as_json)


devices.add_command(list_devices)
devices.add_command(show_device)
devices.add_command(label)
devices.add_command(device_twin)
devices.add_command(logs)
devices.add_command(support_bundle)
