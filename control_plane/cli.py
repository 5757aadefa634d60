"""``edgefleet control-plane`` (the service) and the operator commands, which speak to its API
through :mod:`control_plane.api_client` (how a command finds the control plane and its token is
said there)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import click

from common.cli import OneLineChoice, one_line, settings_failure, subgroup
from control_plane.api_client import Api, connected
from control_plane.cli_io import key_values, print_doc
from control_plane.device_view import device_lines
from control_plane.provisioning.cli import register_fleet
from control_plane.quality.cli import register_quality_commands
from control_plane.registry.cli import register_model_commands
from control_plane.rollouts.cli import register_rollout_commands


def register_control_plane(root: click.Group) -> None:
    @root.group("control-plane", invoke_without_command=True)
    @click.option(
        "--db",
        "db_url",
        help="SQLAlchemy URL (sqlite+aiosqlite:///... or postgresql+psycopg://...).",
    )
    @click.option("--mqtt", "mqtt_url", help="Broker URL, mqtt://host:port or mqtts://.")
    @click.option("--mqtt-username", help="The control plane's broker user.")
    @click.option(
        "--mqtt-password-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="File holding the broker password (read at start-up, trailing newline dropped).",
    )
    @click.option("--host")
    @click.option("--port", type=int)
    @click.option(
        "--signing-key", "signing_key_file", type=click.Path(dir_okay=False, path_type=Path)
    )
    @click.option("--artifact-dir", type=click.Path(file_okay=False, path_type=Path))
    @click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
    @click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path))
    @click.pass_context
    def control_plane(ctx: click.Context, /, config_file: Path | None, **flags: Any) -> None:
        """Run the control plane (registry, inventory, rollouts, telemetry, API)."""
        if ctx.invoked_subcommand is not None:
            ctx.obj = (config_file, flags)
            return
        from pydantic import ValidationError
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        from control_plane.main import run
        from control_plane.settings import load_settings

        try:
            settings = load_settings(config_file, **flags)
        except (ValidationError, FileNotFoundError, tomllib.TOMLDecodeError) as exc:
            raise settings_failure(exc, config_file) from exc
        try:
            make_url(settings.db_url)
        except ArgumentError as exc:
            raise click.ClickException(f"invalid settings: db_url: {exc}") from exc
        run(settings)

    @control_plane.command("token")
    @click.option("--name", required=True)
    @click.option("--role", type=OneLineChoice(["viewer", "operator", "admin"]), required=True)
    @click.option("--create", is_flag=True, help="Make the database if there is none yet.")
    @click.option("--json", "as_json", is_flag=True, help="Print {name, role, token}.")
    @click.pass_obj
    def token(
        obj: tuple[Path | None, dict[str, Any]], name: str, role: str, create: bool, as_json: bool
    ) -> None:
        """Create an API token directly in the control plane's database (printed once). The
        database is found as the server finds it (--config, --db before `token`,
        EDGEFLEET_CP_DB_URL); one that does not exist is an error unless --create."""
        import asyncio

        from pydantic import ValidationError
        from sqlalchemy.exc import ArgumentError, DBAPIError

        from control_plane.api.auth import Role, create_token
        from control_plane.db.session import (
            database_exists,
            describe,
            make_engine,
            migrate,
            session_factory,
        )
        from control_plane.settings import load_settings

        try:
            settings = load_settings(obj[0], **obj[1])
        except (ValidationError, FileNotFoundError, tomllib.TOMLDecodeError) as exc:
            raise settings_failure(exc, obj[0]) from exc

        async def make() -> str:
            engine = make_engine(settings.db_url)
            try:
                async with session_factory(engine).begin() as s:
                    return await create_token(s, name, Role[role.upper()])
            finally:
                await engine.dispose()

        try:
            # A token written to a database the running control plane does not use is one it
            # rejects: a relative SQLite path, run from another directory, is a new file.
            if not database_exists(settings.db_url) and not create:
                raise click.ClickException(
                    f"no control plane database in {describe(settings.db_url)}: name the one "
                    "the control plane uses as it does (edgefleet control-plane --config FILE "
                    "token ..., --db URL, or EDGEFLEET_CP_DB_URL), run this where it runs, or "
                    "pass --create to make a new one"
                )
            migrate(settings.db_url)
            made = asyncio.run(make())
        except ArgumentError as exc:
            raise click.ClickException(f"invalid settings: db_url: {exc}") from exc
        except (DBAPIError, OSError) as exc:
            detail = one_line(str(getattr(exc, "orig", None) or exc))
            raise click.ClickException(
                f"database {describe(settings.db_url)}: {type(exc).__name__}: {detail}"
            ) from exc
        print_doc({"name": name, "role": role, "token": made} if as_json else made, as_json)

    del control_plane, token
    register_fleet(root)  # local to the control plane's state directory, like `token`


def register_operator_commands(root: click.Group) -> None:
    from control_plane.deployments.cli import register_deployment_commands, register_window_commands
    from control_plane.enrolment.cli import register_enrolment_commands

    register_enrolment_commands(root)
    register_deployment_commands(root)
    register_window_commands(root)
    models = subgroup(root, "models", "Model repositories and the model registry.")
    register_quality_commands(models)
    register_model_commands(models)
    rollouts = subgroup(root, "rollouts", "Staged rollouts.")
    register_rollout_commands(rollouts)
    devices = subgroup(root, "devices", "The device inventory.")
    keys = subgroup(root, "keys", "Signing keys and the trust root.")
    as_json_option = click.option(
        "--json", "as_json", is_flag=True, help="Print the control plane's JSON document."
    )

    @devices.command("list")
    @click.option("--label", multiple=True, help="key=value (repeatable)")
    @click.option("--profile")
    @click.option(
        "--online/--offline",
        default=None,
        help="online: its last status says so and it was heard from lately",
    )
    @click.option("--silent", is_flag=True, help="only devices online by status but silent")
    @click.option(
        "--trust-root-version",
        type=click.IntRange(min=1),
        help="only devices that hold this trust root version",
    )
    @as_json_option
    @connected
    def list_devices(
        label: tuple[str, ...],
        profile: str | None,
        online: bool | None,
        silent: bool,
        trust_root_version: int | None,
        as_json: bool,
    ) -> None:
        """Devices, filtered by labels, profile, presence (online, offline, or silent: online
        by its last status, but nothing heard from it for longer than its limit) and the trust
        root version they hold (shown as root N; root ? for an agent that does not say)."""
        key_values(label, "--label", "key=value")
        params: dict[str, Any] = {"label": list(label)}
        if profile:
            params["profile"] = profile
        if trust_root_version is not None:
            params["trust_root_version"] = trust_root_version
        if online is not None:
            params["online"] = str(online).lower()
        if silent:
            params["presence"] = "silent"
        doc = Api.connect().call("GET", "/api/v1/devices", params=params)
        if as_json:
            print_doc(doc, True)
            return
        for d in doc:
            served = ", ".join(f"{m['model']} v{m['version']}" for m in d["models"])
            labels = ",".join(f"{k}={v}" for k, v in sorted(d["labels"].items()))
            root = d["trust_root_version"] or "?"
            click.echo(
                f"{d['id']:<20} {d['presence']:<7} "
                f"{d['hardware_profile'] or '?':<20} root {root:<3} "
                f"{labels:<30} {served}"
            )

    @devices.command("show")
    @click.argument("device_id")
    @as_json_option
    @connected
    def show_device(device_id: str, as_json: bool) -> None:
        """One device: presence, agent and trust root versions, labels, the models it serves
        and its last telemetry (sequence, CPU, memory, messages it dropped)."""
        from urllib.parse import quote

        # quoted: an id with "/", "?" or "#" would name another route
        doc = Api.connect().call("GET", f"/api/v1/devices/{quote(device_id, safe='')}")
        print_doc(doc if as_json else "\n".join(device_lines(doc)), as_json)

    @devices.command("label")
    @click.argument("device_id")
    @click.argument("labels", nargs=-1, required=True)
    @click.option("--json", "as_json", is_flag=True, help="Print the device's document.")
    @connected
    def label(device_id: str, labels: tuple[str, ...], as_json: bool) -> None:
        """Set operator labels (key=value), or remove one (key=)."""
        pairs = key_values(labels, "LABELS", "key=value, or key= to remove it")
        changes = {k: (v or None) for k, v in pairs.items()}
        doc = Api.connect().call(
            "PATCH", f"/api/v1/devices/{device_id}/labels", json={"labels": changes}
        )
        own = ",".join(f"{k}={v}" for k, v in sorted(doc["operator_labels"].items()))
        print_doc(doc if as_json else f"{doc['id']}: operator labels {own or 'none'}", as_json)

    @keys.command("rotate")
    @as_json_option
    @connected
    def rotate(as_json: bool) -> None:
        """New manifest key, announced to devices beside the old one and used from now on."""
        doc = Api.connect().call("POST", "/api/v1/keys/rotate")
        if as_json:
            print_doc(doc, True)
            return
        click.echo(
            f"signing with {doc['signing_key']}; "
            "revoke the old key once the fleet has trust root N+1"
        )

    @keys.command("revoke")
    @click.argument("key_id")
    @as_json_option
    @connected
    def revoke(key_id: str, as_json: bool) -> None:
        """Revoke a manifest key."""
        doc = Api.connect().call("POST", f"/api/v1/keys/{key_id}/revoke")
        if as_json:
            print_doc(doc, True)
            return
        click.echo(f"trust root {doc['version']}: revoked {', '.join(doc['revoked'])}")

    del list_devices, label, show_device, rotate, revoke


def register_demo(root: click.Group) -> None:
    @root.command()
    @click.option(
        "--workdir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("var/demo"),
        show_default=True,
        help="Where the demo writes its files (emptied first).",
    )
    @click.option(
        "--mqtt", "mqtt_url", help="Use this broker instead of starting a private Mosquitto."
    )
    @click.option(
        "--log-level",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
        default="INFO",
        show_default=True,
        help="Of every process the demo starts (DEBUG: the broker logs every packet too).",
    )
    def demo(workdir: Path, mqtt_url: str | None, log_level: str) -> None:
        """The whole story on this machine: broker, control plane, two agents of different
        hardware profiles; a staged rollout, inference on both, a bad version rolled back."""
        from control_plane.demo import run_demo

        raise SystemExit(run_demo(workdir, click.echo, mqtt_url, log_level))

    del demo
