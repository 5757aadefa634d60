"""``edgefleet costs``: what devices cost per hour, and what a version costs per thousand
predictions (through the API; :mod:`control_plane.quality.cost` says how)."""

from __future__ import annotations

import json
from typing import Any

import click

from control_plane.cli.api_client import Api, connected
from control_plane.cli.io import json_option


@click.group("costs")
def costs() -> None:
    """Device cost rates and the cost per thousand predictions of a version."""


def _rate(item: str, param: str) -> tuple[str, float]:
    target, sep, amount = item.rpartition(":")
    try:
        if not sep or not target:
            raise ValueError
        return target, float(amount)
    except ValueError:
        message = f"expected TARGET:PER_HOUR, got {item!r}"
        raise click.BadParameter(message, param_hint=param) from None


def _rate_line(rate: dict[str, Any]) -> str:
    target = (
        f"label {rate['label']}"
        if "label" in rate
        else f"profile {rate['profile']}"
        if "profile" in rate
        else "default"
    )
    return f"{target}: {rate['per_hour']:g} per hour"


@click.command("set-rates")
@click.option("--default", "default", type=float, help="Per hour of any other device.")
@click.option("--profile", multiple=True, help="PROFILE:PER_HOUR for a hardware profile.")
@click.option("--label", multiple=True, help="NAME=VALUE:PER_HOUR for the devices so labelled.")
@json_option
@connected
def set_rates(
    default: float | None, profile: tuple[str, ...], label: tuple[str, ...], as_json: bool
) -> None:
    """Replace every cost rate. A device is priced by its first matching label rate, else its
    profile's, else the default; one with none is left out of the cost."""
    rates: list[dict[str, Any]] = [
        {"label": target, "per_hour": amount}
        for target, amount in (_rate(i, "--label") for i in label)
    ]
    rates += [
        {"profile": target, "per_hour": amount}
        for target, amount in (_rate(i, "--profile") for i in profile)
    ]
    if default is not None:
        rates.append({"per_hour": default})
    doc = Api.connect().call("PUT", "/api/v1/cost-rates", json={"rates": rates})
    click.echo(json.dumps(doc, indent=2) if as_json else "\n".join(map(_rate_line, doc["rates"])))


@click.command("rates")
@json_option
@connected
def rates(as_json: bool) -> None:
    """The cost rates set."""
    doc = Api.connect().call("GET", "/api/v1/cost-rates")
    lines = "\n".join(map(_rate_line, doc["rates"])) or "no cost rates set"
    click.echo(json.dumps(doc, indent=2) if as_json else lines)


@click.command("show")
@click.argument("name")
@click.argument("version", type=int)
@click.option(
    "--window",
    "window_s",
    type=float,
    default=3600.0,
    show_default=True,
    help="Seconds back from now.",
)
@json_option
@connected
def show(name: str, version: int, window_s: float, as_json: bool) -> None:
    """What VERSION of NAME cost per thousand predictions, over the last window, and on
    which devices."""
    doc = Api.connect().call(
        "GET", f"/api/v1/models/{name}/versions/{version}/cost", params={"window_s": window_s}
    )
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    per_1k = doc["per_1k_predictions"]
    head = f"{per_1k:.6g} per 1,000 predictions" if per_1k is not None else "no priced predictions"
    click.echo(
        f"{name} v{version}: {head} ({doc['rows']} rows, {doc['busy_s']:.3f} s busy, "
        f"cost {doc['cost']:.6g}, last {window_s:g} s)"
    )
    for d in doc["devices"]:
        click.echo(
            f"  {d['device_id']}: {d['rows']} rows, {d['busy_s']:.3f} s busy at "
            f"{d['per_hour']:g}/h ({d['rate']})"
        )
    if doc["unpriced_devices"]:
        click.echo(f"  unpriced (no rate): {', '.join(doc['unpriced_devices'])}")


costs.add_command(set_rates)
costs.add_command(rates)
costs.add_command(show)
