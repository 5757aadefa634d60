"""``edgefleet claims`` and ``edgefleet enrolments``: zero-touch provisioning, for operators
(through the control plane's API, as the other operator commands)."""

from __future__ import annotations

import json
from typing import Any

import click

from control_plane.cli.api_client import Api, connected
from control_plane.cli.io import json_option, label_pairs


@click.group("claims")
def claims() -> None:
    """Claim tokens: devices that hold one enrol themselves."""


@click.group("enrolments")
def enrolments() -> None:
    """Devices that presented a claim."""


def _claim_line(c: dict[str, Any]) -> str:
    labels = ",".join(f"{k}={v}" for k, v in sorted(c["labels"].items())) or "no labels"
    return (
        f"claim {c['id']} {c['name']!r}: {c['state']}, used {c['uses']}/{c['max_uses']}, "
        f"{labels}, expires {c['expires_at']}"
        + (", needs approval" if c["require_approval"] else "")
    )


@click.command("create")
@click.argument("name")
@click.option("--label", "labels", multiple=True, help="key=value every device gets.")
@click.option("--profile", "profiles", multiple=True, help="A hardware profile it may enrol.")
@click.option("--max-uses", type=click.IntRange(1, 1_000_000), default=1, show_default=True)
@click.option(
    "--ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=7 * 86400.0,
    show_default=True,
    help="Seconds it admits new devices.",
)
@click.option("--require-approval", is_flag=True, help="Devices wait for an operator.")
@json_option
@connected
def create(
    name: str,
    labels: tuple[str, ...],
    profiles: tuple[str, ...],
    max_uses: int,
    ttl: float,
    require_approval: bool,
    as_json: bool,
) -> None:
    """Create a claim; its token is printed this once (give it to the devices)."""
    spec = {
        "name": name,
        "labels": label_pairs(labels, "--label"),
        "profiles": list(profiles),
        "max_uses": max_uses,
        "ttl_s": ttl,
        "require_approval": require_approval,
    }
    doc = Api.connect().call("POST", "/api/v1/claims", json=spec)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(_claim_line(doc), err=True)
    click.echo(doc["token"])


@click.command("list")
@json_option
@connected
def list_claims(as_json: bool) -> None:
    """Claims, oldest first (no tokens)."""
    doc = Api.connect().call("GET", "/api/v1/claims")
    click.echo(json.dumps(doc, indent=2) if as_json else "\n".join(map(_claim_line, doc)))


@click.command("revoke")
@click.argument("claim_id")
@json_option
@connected
def revoke(claim_id: str, as_json: bool) -> None:
    """Revoke a claim: it enrols no one from now (devices it enrolled keep their identity)."""
    doc = Api.connect().call("POST", f"/api/v1/claims/{claim_id}/revoke")
    click.echo(json.dumps(doc, indent=2) if as_json else _claim_line(doc))


@click.command("list")
@click.option("--pending", is_flag=True, help="Only devices waiting for a decision.")
@json_option
@connected
def list_enrolments(pending: bool, as_json: bool) -> None:
    """Devices that presented a claim."""
    params = {"state": "pending"} if pending else {}
    doc = Api.connect().call("GET", "/api/v1/enrolments", params=params)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for e in doc:
        click.echo(
            f"{e['device_id']}: {e['state']} ({e['hardware_profile']}, claim {e['claim_id']},"
            f" asked {e['requested_at']})" + (f": {e['reason']}" if e["reason"] else "")
        )


def _decision(decision: str) -> click.Command:
    """``enrolments approve|reject DEVICE_ID``: one POST each."""

    @click.command(decision, help=f"{decision.capitalize()} a device waiting for approval.")
    @click.argument("device_id")
    @click.option("--reason", default="", help="Kept, and told to a rejected device.")
    @json_option
    @connected
    def decide(device_id: str, reason: str, as_json: bool) -> None:
        doc = Api.connect().call(
            "POST", f"/api/v1/enrolments/{device_id}/{decision}", json={"reason": reason}
        )
        click.echo(json.dumps(doc, indent=2) if as_json else f"{doc['device_id']}: {doc['state']}")

    return decide


claims.add_command(create)
claims.add_command(list_claims)
claims.add_command(revoke)
enrolments.add_command(list_enrolments)
enrolments.add_command(_decision("approve"))
enrolments.add_command(_decision("reject"))
