"""``edgefleet agents pack|push|list``: agent releases in the registry, for operators (through
the API). Rolling one out is ``edgefleet rollouts create --agent VERSION``."""

from __future__ import annotations

from pathlib import Path

import click

from control_plane.cli.api_client import Api, connected
from control_plane.cli.io import json_document_option, print_doc


@click.group("agents")
def agents() -> None:
    """Agent releases: the agent itself, updated from the fleet under its launcher."""


@agents.command("pack")
@click.argument("version")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--lib",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A folder of packages to ship as the release's lib/ (default: none; the release "
    "runs the agent installed beside the launcher).",
)
def pack(version: str, out: Path, lib: Path | None) -> None:
    """Write a release tree of VERSION as OUT (.tar.gz), ready for ``agents push``."""
    from common.release_tree import ReleaseTreeError
    from common.release_tree import pack as pack_tree

    if out.exists():  # a release file is not overwritten by mistake
        raise click.BadParameter(f"{out} exists; remove it or name another file", param_hint="OUT")
    try:
        pack_tree(out, version, lib=lib)
    except ReleaseTreeError as exc:
        raise click.BadParameter(str(exc), param_hint="VERSION") from exc
    except OSError as exc:
        raise click.ClickException(f"{exc.filename or out}: {exc.strerror or exc}") from exc
    click.echo(f"wrote {out} (agent release {version})")


@agents.command("push")
@click.argument("version")
@click.argument("tarball", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--description", default="", help="Shown with the release.")
@json_document_option
@connected
def push(version: str, tarball: Path, description: str, as_json: bool) -> None:
    """Push TARBALL (a release tree's .tar.gz whose release.json names VERSION)."""
    with tarball.open("rb") as fh:
        doc = Api.connect().call(
            "PUT",
            f"/api/v1/agent-releases/{version}",
            params={"description": description} if description else None,
            content=fh,
        )
    if as_json:
        print_doc(doc, True)
        return
    click.echo(
        f"agent release {doc['version']}: sequence {doc['sequence']}, "
        f"{doc['size']} bytes, sha256 {doc['sha256'][:12]}"
    )


@agents.command("list")
@json_document_option
@connected
def list_releases(as_json: bool) -> None:
    """Agent releases in the registry, oldest first."""
    doc = Api.connect().call("GET", "/api/v1/agent-releases")
    if as_json:
        print_doc(doc, True)
        return
    if not doc:
        click.echo("no agent releases")
    for r in doc:
        click.echo(
            f"{r['version']}: sequence {r['sequence']}, {r['size']} bytes, "
            f"pushed by {r['uploaded_by']} at {r['created_at']}"
        )
