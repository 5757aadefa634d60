"""``edgefleet twin``: set and list config twins; ``edgefleet devices twin``: one device's
desired twin against what it reports (through the API)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import click

from control_plane.cli.api_client import Api, connected
from control_plane.cli.io import json_document_option, key_values, print_doc


@click.group("twin")
def twin() -> None:
    """Config twins: settings and application keys per device or label group."""


def _value(text: str) -> Any:
    """A value as JSON where it parses (2, true, {"a": 1}), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


@click.command("set")
@click.option("--device", help="the device's own twin (wins over its groups')")
@click.option("--selector", multiple=True, help="key=value: a label group's twin (repeatable)")
@click.option("--unset", multiple=True, help="a key to remove (repeatable)")
@click.argument("assignments", nargs=-1)
@json_document_option
@connected
def set_twin(
    device: str | None,
    selector: tuple[str, ...],
    unset: tuple[str, ...],
    assignments: tuple[str, ...],
    as_json: bool,
) -> None:
    """Set KEY=VALUE pairs of a twin: agent settings by name (telemetry_interval_s=5,
    log_level=DEBUG), application keys as app.KEY=VALUE. Values are JSON where they parse.
    The control plane signs a new twin for each device whose document changed."""
    values = {k: _value(v) for k, v in key_values(assignments, "KEY=VALUE", "key=value").items()}
    body: dict[str, Any] = {
        "selector": key_values(selector, "--selector", "key=value"),
        "set": values,
        "unset": list(unset),
    }
    if device is not None:
        body["device"] = device
    doc = Api.connect().call("PUT", "/api/v1/twins", json=body)
    if as_json:
        print_doc(doc, True)
        return
    click.echo(f"{doc['target']}: settings {json.dumps(doc['settings'], sort_keys=True)}")
    click.echo(f"{' ' * len(doc['target'])}  app {json.dumps(doc['app'], sort_keys=True)}")
    signed = doc["signed_for"]
    click.echo(f"signed for {len(signed)} device(s): {', '.join(signed) or '-'}")


@click.command("list")
@json_document_option
@connected
def list_twins(as_json: bool) -> None:
    """The twins, one per device or label group."""
    doc = Api.connect().call("GET", "/api/v1/twins")
    if as_json:
        print_doc(doc, True)
        return
    for t in doc["twins"]:
        settings = json.dumps(t["settings"], sort_keys=True)
        click.echo(f"{t['target']:<30} {settings} app {json.dumps(t['app'], sort_keys=True)}")


twin.add_command(set_twin)
twin.add_command(list_twins)


@click.command("twin")
@click.argument("device_id")
@json_document_option
@connected
def device_twin(device_id: str, as_json: bool) -> None:
    """A device's config twin: the version desired and the one reported, each key's state
    (rejected with the device's reason, pending a restart, or differing), and app keys."""
    doc = Api.connect().call("GET", f"/api/v1/devices/{quote(device_id, safe='')}/twin")
    if as_json:
        print_doc(doc, True)
        return
    desired, reported = doc["desired"], doc["reported"]
    if desired is None:
        click.echo(f"{device_id}: no config twin")
        return
    have = reported["version"] if reported else "-"
    click.echo(f"{device_id}: desired version {desired['version']}, reported {have}")
    values = reported["reported"] if reported else {}
    for key, want in sorted(desired["settings"].items()):
        click.echo(
            f"  {key:<24} desired {json.dumps(want):<12} reported {json.dumps(values.get(key))}"
        )
    click.echo(f"  {'app':<24} {json.dumps(desired['app'], sort_keys=True)}")
    if not doc["diff"]:
        click.echo("in sync: reported == desired")
        return
    click.echo("differences:")
    for d in doc["diff"]:
        why = f" ({d['reason']})" if d.get("reason") else ""
        click.echo(f"  {d['key']:<24} {d['state']}{why}")
