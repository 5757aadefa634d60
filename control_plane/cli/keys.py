"""``edgefleet keys``: the manifest signing keys and the trust root, for operators (through the
API)."""

from __future__ import annotations

import click

from control_plane.cli.api_client import Api, connected
from control_plane.cli.io import json_document_option, print_doc


@click.group("keys")
def keys() -> None:
    """Signing keys and the trust root."""


@click.command("rotate")
@json_document_option
@connected
def rotate(as_json: bool) -> None:
    """New manifest key, announced to devices beside the old one and used from now on."""
    doc = Api.connect().call("POST", "/api/v1/keys/rotate")
    if as_json:
        print_doc(doc, True)
        return
    click.echo(
        f"signing with {doc['signing_key']}; revoke the old key once the fleet has trust root N+1"
    )


@click.command("revoke")
@click.argument("key_id")
@json_document_option
@connected
def revoke(key_id: str, as_json: bool) -> None:
    """Revoke a manifest key."""
    doc = Api.connect().call("POST", f"/api/v1/keys/{key_id}/revoke")
    if as_json:
        print_doc(doc, True)
        return
    click.echo(f"trust root {doc['version']}: revoked {', '.join(doc['revoked'])}")


keys.add_command(rotate)
keys.add_command(revoke)
