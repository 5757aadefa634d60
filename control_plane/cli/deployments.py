"""``edgefleet deployments``: continuous deployments, for operators (through the API)."""

from __future__ import annotations

import json
from typing import Any

import click

from control_plane.cli.api_client import Api, connected
from control_plane.cli.io import json_option, label_pairs


@click.group("deployments")
def deployments() -> None:
    """Continuous deployments to label groups."""


def _line(d: dict[str, Any]) -> str:
    st = d["status"]
    selector = ",".join(f"{k}={v}" for k, v in sorted(d["selector"].items())) or "every device"
    active = f", rollout {st['active_rollout']} active" if st["active_rollout"] else ""
    problem = f" ({d['problem']})" if d.get("problem") else ""
    paused = f", paused by {d['paused_by']}" if d.get("paused") else ""
    return (
        f"{d['name']}: {d['model']} v{d['version']} to {selector}: {st['in_compliance']}/"
        f"{st['devices']} in compliance{active}{paused}{problem}"
    )


@click.command("create")
@click.argument("name")
@click.argument("model")
@click.argument("version", type=click.IntRange(1, 2**31 - 1))
@click.option("--selector", "selector", multiple=True, help="label=value (repeatable).")
@click.option("--profile", "profiles", multiple=True, help="Hardware profile (repeatable).")
@click.option("--priority", type=click.IntRange(-1000, 1000), default=0, show_default=True)
@click.option("--waves", default="1,10%,50%,100%", show_default=True)
@click.option("--bake-time", type=float, default=60.0, show_default=True)
@click.option("--device-timeout", type=float, default=600.0, show_default=True)
@click.option("--gates", "gates_json", default="{}", help="Gates as JSON (rollouts' gates).")
@json_option
@connected
def create(
    name: str,
    model: str,
    version: int,
    selector: tuple[str, ...],
    profiles: tuple[str, ...],
    priority: int,
    waves: str,
    bake_time: float,
    device_timeout: float,
    gates_json: str,
    as_json: bool,
) -> None:
    """Deploy MODEL VERSION to the devices of the selector, and to those that match later."""
    pairs = label_pairs(selector, "--selector")
    try:
        gates = json.loads(gates_json)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gates") from exc
    spec = {
        "name": name,
        "model": model,
        "version": version,
        "selector": pairs,
        "profiles": list(profiles),
        "priority": priority,
        "waves": waves.split(","),
        "bake_time_s": bake_time,
        "device_timeout_s": device_timeout,
        "gates": gates,
    }
    doc = Api.connect().call("POST", "/api/v1/deployments", json=spec)
    click.echo(json.dumps(doc, indent=2) if as_json else _line(doc))


@click.command("list")
@json_option
@connected
def list_deployments(as_json: bool) -> None:
    """Deployments and how many of their devices are in compliance."""
    doc = Api.connect().call("GET", "/api/v1/deployments")
    click.echo(json.dumps(doc, indent=2) if as_json else "\n".join(map(_line, doc)))


@click.command("status")
@click.argument("name")
@json_option
@connected
def status(name: str, as_json: bool) -> None:
    """A deployment, and the state of each of its devices."""
    doc = Api.connect().call("GET", f"/api/v1/deployments/{name}")
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(_line(doc))
    for device_id, state in doc["devices"].items():
        click.echo(f"  {device_id}: {state}")


@click.command("set-version")
@click.argument("name")
@click.argument("version", type=click.IntRange(1, 2**31 - 1))
@json_option
@connected
def set_version(name: str, version: int, as_json: bool) -> None:
    """Move a deployment to VERSION: a rollout to its devices, with its waves and gates."""
    doc = Api.connect().call("PATCH", f"/api/v1/deployments/{name}", json={"version": version})
    click.echo(json.dumps(doc, indent=2) if as_json else _line(doc))


def _hold(action: str, help_text: str) -> click.Command:
    @click.command(action, help=help_text)
    @click.argument("name")
    @json_option
    @connected
    def command(name: str, as_json: bool) -> None:
        doc = Api.connect().call("POST", f"/api/v1/deployments/{name}/{action}")
        click.echo(json.dumps(doc, indent=2) if as_json else _line(doc))

    return command


pause = _hold("pause", "Hold a deployment: it starts no rollout, and its running one pauses.")
resume = _hold("resume", "Let a paused deployment go on (its paused rollout too).")


@click.command("delete")
@click.argument("name")
@connected
def delete(name: str) -> None:
    """Delete a deployment: its devices keep what they run."""
    Api.connect().call("DELETE", f"/api/v1/deployments/{name}")
    click.echo(f"deleted {name}")


deployments.add_command(create)
deployments.add_command(list_deployments)
deployments.add_command(status)
deployments.add_command(set_version)
deployments.add_command(pause)
deployments.add_command(resume)
deployments.add_command(delete)
