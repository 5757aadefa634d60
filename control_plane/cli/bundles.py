"""``edgefleet bundle create``: an offline bundle of signed model versions for one device,
written to a file (the device side's ``edgefleet bundle install`` applies it)."""

from __future__ import annotations

from pathlib import Path

import click

from control_plane.cli.api_client import Api, connected


def _model(value: str) -> dict[str, object]:
    name, sep, version = value.rpartition(":")
    if not sep or not name or not version.isdigit() or int(version) < 1:
        raise click.BadParameter(f"expected NAME:VERSION (mlp:2), got {value!r}")
    return {"model": name, "version": int(version)}


@click.command("create")
@click.option("--device", "device_id", required=True, help="The device that installs it.")
@click.option(
    "--model",
    "models",
    multiple=True,
    help="NAME:VERSION of a validated version (repeatable).",
)
@click.option("--agent", "agent_version", help="An agent release VERSION to bundle too.")
@click.option(
    "--ttl-s",
    type=click.FloatRange(min=0, min_open=True),
    help="How long it stays installable (default: the control plane's manifest_ttl_s).",
)
@click.option(
    "-o", "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="File."
)
@connected
def create(
    device_id: str,
    models: tuple[str, ...],
    agent_version: str | None,
    ttl_s: float | None,
    out: Path,
) -> None:
    """Write a signed bundle of model versions (and an agent release) for DEVICE to a file;
    each becomes the device's desired one, so the control plane agrees with the device when it
    reconnects."""
    if out.exists():  # a bundle is not overwritten by mistake
        raise click.BadParameter(f"{out} exists; remove it or name another file", param_hint="-o")
    if not models and agent_version is None:
        raise click.UsageError("name a --model NAME:VERSION, or an --agent VERSION")
    spec: dict[str, object] = {"device_id": device_id, "models": [_model(m) for m in models]}
    if agent_version is not None:
        spec["agent_version"] = agent_version
    if ttl_s is not None:
        spec["ttl_s"] = ttl_s
    body = Api.connect().content("/api/v1/bundles", method="POST", json=spec)
    try:
        out.write_bytes(body)
    except OSError as exc:
        raise click.ClickException(f"{out}: {exc.strerror or exc}") from exc
    names = ", ".join(
        [f"{m['model']} v{m['version']}" for m in map(_model, models)]
        + ([f"agent release {agent_version}"] if agent_version else [])
    )
    click.echo(f"wrote {out} ({len(body)} bytes): {names} for {device_id}")
