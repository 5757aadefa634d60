"""``edgefleet models accuracy``: a version's live accuracy (or error) from the outcomes apps
posted for its predictions, and its concept drift (docs/model-quality.md, "Ground truth and
live accuracy")."""

from __future__ import annotations

import json
from typing import Any

import click

from control_plane.cli.api_client import Api, connected


@click.command("accuracy")
@click.argument("name")
@click.argument("version", type=int)
@click.option(
    "--since", "since_s", type=float, default=3600.0, show_default=True, help="seconds back"
)
@click.option("--bucket", "bucket_s", type=float, default=300.0, show_default=True, help="seconds")
@click.option("--group-by", help="A device label: the accuracy per value of it.")
@click.option("--json", "as_json", is_flag=True, help="Print the control plane's document.")
@connected
def accuracy(
    name: str, version: int, since_s: float, bucket_s: float, group_by: str | None, as_json: bool
) -> None:
    """Live accuracy of VERSION of NAME over the fleet, per device, per true label and over
    time, against its reference accuracy (concept drift)."""
    params: dict[str, Any] = {"since_s": since_s, "bucket_s": bucket_s}
    if group_by:
        params["group_by"] = group_by
    path = f"/api/v1/models/{name}/versions/{version}/accuracy"
    doc = Api.connect().call("GET", path, params=params)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    fleet = doc["fleet"]
    if not fleet["outcomes"]:
        click.echo(f"{name} v{version}: no outcomes in the last {since_s:g} s")
        return
    click.echo(f"{name} v{version}: {figure(fleet)} (last {since_s:g} s)")
    drift = doc["concept_drift"]
    if drift["reference_accuracy"] is not None:
        state = "OVER" if drift["over_threshold"] else "ok"
        drop = "" if drift["drop"] is None else f", drop {drift['drop']:.3f}"
        click.echo(
            f"concept drift: {state} (reference accuracy {drift['reference_accuracy']:.3f}"
            f"{drop}, threshold {drift['threshold']:g} over {drift['window_s']:g} s)"
            + (f"; {drift['note']}" if drift.get("note") else "")
        )
    sections = [
        ("devices", "device_id", "by device"),
        ("groups", "value", f"by {doc.get('group_by')}"),
        ("labels", "label", "by true label"),
        ("buckets", "start", f"over time ({bucket_s:g} s buckets)"),
    ]
    for key, field, title in sections:
        if doc.get(key):
            click.echo(f"{title}:")
            for row in doc[key]:
                click.echo(f"  {row[field]}: {figure(row)}")


def figure(row: dict[str, Any]) -> str:
    if "accuracy" in row:
        return f"accuracy {row['accuracy']:.3f} over {row['outcomes']} outcomes"
    return f"mean absolute error {row['mean_abs_error']:.4g} over {row['outcomes']} outcomes"
