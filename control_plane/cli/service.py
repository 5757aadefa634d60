"""``edgefleet control-plane``: the service itself (run with no subcommand), and ``token``, which
writes an API token straight into its database. Both read the control plane's settings as the
server does (``--config``, the flags before a subcommand, ``EDGEFLEET_CP_*``)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import click

from common.cli import OneLineChoice, one_line, settings_failure
from control_plane.cli.io import print_doc


@click.group("control-plane", invoke_without_command=True)
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
@click.option("--signing-key", "signing_key_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--artifact-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def service(ctx: click.Context, /, config_file: Path | None, **flags: Any) -> None:
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


@click.command("token")
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

    from control_plane.db.session import (
        database_exists,
        describe,
        make_engine,
        migrate,
        session_factory,
    )
    from control_plane.settings import load_settings
    from control_plane.tokens import Role, create_token

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


service.add_command(token)
