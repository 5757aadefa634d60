"""``edgefleet windows``: maintenance windows, for operators (through the API)."""

from __future__ import annotations

import json
from typing import Any

import click

from control_plane.cli.api_client import Api, connected
from control_plane.cli.io import json_option, label_pairs


@click.group("windows")
def windows() -> None:
    """Maintenance windows: when devices may start updates."""


def _window_line(w: dict[str, Any]) -> str:
    selector = ",".join(f"{k}={v}" for k, v in sorted(w["selector"].items())) or "every device"
    state = "open" if w["open_now"] else f"closed, opens {w['next_open'] or 'never'}"
    return (
        f"{w['name']}: {selector} at '{w['cron']}' ({w['timezone']}) "
        f"for {w['duration_s']:g} s: {state}"
    )


@click.command("create")
@click.argument("name")
@click.option("--cron", required=True, help="When it opens: 'minute hour day month weekday'.")
@click.option("--duration", type=float, required=True, help="Seconds it stays open.")
@click.option("--timezone", default="UTC", show_default=True, help="IANA name.")
@click.option("--selector", multiple=True, help="label=value of the devices it holds.")
@json_option
@connected
def create(
    name: str,
    cron: str,
    duration: float,
    timezone: str,
    selector: tuple[str, ...],
    as_json: bool,
) -> None:
    """Hold the devices of the selector to start updates only while it is open."""
    pairs = label_pairs(selector, "--selector")
    spec = {
        "name": name,
        "cron": cron,
        "duration_s": duration,
        "timezone": timezone,
        "selector": pairs,
    }
    doc = Api.connect().call("POST", "/api/v1/maintenance-windows", json=spec)
    click.echo(json.dumps(doc, indent=2) if as_json else _window_line(doc))


@click.command("list")
@json_option
@connected
def list_windows(as_json: bool) -> None:
    """Maintenance windows, open now or when they open next."""
    doc = Api.connect().call("GET", "/api/v1/maintenance-windows")
    click.echo(json.dumps(doc, indent=2) if as_json else "\n".join(map(_window_line, doc)))


@click.command("delete")
@click.argument("name")
@connected
def delete(name: str) -> None:
    """Delete a maintenance window."""
    Api.connect().call("DELETE", f"/api/v1/maintenance-windows/{name}")
    click.echo(f"deleted {name}")


windows.add_command(create)
windows.add_command(list_windows)
windows.add_command(delete)
