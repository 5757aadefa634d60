"""``edgefleet deployments``: continuous deployments, for operators (through the API)."""

from __future__ import annotations

import json
from typing import Any

import click

from common.cli import subgroup
from control_plane.api_client import Api, connected


def label_pairs(values: tuple[str, ...], param: str) -> dict[str, str]:
    """``label=value`` options as a dict (a value may be empty)."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected label=value, got {item!r}", param_hint=param)
        out[key] = value
    return out


def _line(d: dict[str, Any]) -> str:
    st = d["status"]
    selector = ",".join(f"{k}={v}" for k, v in sorted(d["selector"].items())) or "every device"
    active = f", rollout {st['active_rollout']} active" if st["active_rollout"] else ""
    problem = f" ({d['problem']})" if d.get("problem") else ""
    return (
        f"{d['name']}: {d['model']} v{d['version']} to {selector}: {st['in_compliance']}/"
        f"{st['devices']} in compliance{active}{problem}"
    )


def register_deployment_commands(root: click.Group) -> None:
    group = subgroup(root, "deployments", "Continuous deployments to label groups.")
    as_json_option = click.option("--json", "as_json", is_flag=True, help="Print the JSON.")

    @group.command("create")
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
    @as_json_option
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

    @group.command("list")
    @as_json_option
    @connected
    def list_deployments(as_json: bool) -> None:
        """Deployments and how many of their devices are in compliance."""
        doc = Api.connect().call("GET", "/api/v1/deployments")
        click.echo(json.dumps(doc, indent=2) if as_json else "\n".join(map(_line, doc)))

    @group.command("status")
    @click.argument("name")
    @as_json_option
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

    @group.command("set-version")
    @click.argument("name")
    @click.argument("version", type=click.IntRange(1, 2**31 - 1))
    @as_json_option
    @connected
    def set_version(name: str, version: int, as_json: bool) -> None:
        """Move a deployment to VERSION: a rollout to its devices, with its waves and gates."""
        doc = Api.connect().call("PATCH", f"/api/v1/deployments/{name}", json={"version": version})
        click.echo(json.dumps(doc, indent=2) if as_json else _line(doc))

    @group.command("delete")
    @click.argument("name")
    @connected
    def delete(name: str) -> None:
        """Delete a deployment: its devices keep what they run."""
        Api.connect().call("DELETE", f"/api/v1/deployments/{name}")
        click.echo(f"deleted {name}")


def _window_line(w: dict[str, Any]) -> str:
    selector = ",".join(f"{k}={v}" for k, v in sorted(w["selector"].items())) or "every device"
    state = "open" if w["open_now"] else f"closed, opens {w['next_open'] or 'never'}"
    return (
        f"{w['name']}: {selector} at '{w['cron']}' ({w['timezone']}) "
        f"for {w['duration_s']:g} s: {state}"
    )


def register_window_commands(root: click.Group) -> None:
    group = subgroup(root, "windows", "Maintenance windows: when devices may start updates.")
    as_json_option = click.option("--json", "as_json", is_flag=True, help="Print the JSON.")

    @group.command("create")
    @click.argument("name")
    @click.option("--cron", required=True, help="When it opens: 'minute hour day month weekday'.")
    @click.option("--duration", type=float, required=True, help="Seconds it stays open.")
    @click.option("--timezone", default="UTC", show_default=True, help="IANA name.")
    @click.option("--selector", multiple=True, help="label=value of the devices it holds.")
    @as_json_option
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

    @group.command("list")
    @as_json_option
    @connected
    def list_windows(as_json: bool) -> None:
        """Maintenance windows, open now or when they open next."""
        doc = Api.connect().call("GET", "/api/v1/maintenance-windows")
        click.echo(json.dumps(doc, indent=2) if as_json else "\n".join(map(_window_line, doc)))

    @group.command("delete")
    @click.argument("name")
    @connected
    def delete(name: str) -> None:
        """Delete a maintenance window."""
        Api.connect().call("DELETE", f"/api/v1/maintenance-windows/{name}")
        click.echo(f"deleted {name}")
