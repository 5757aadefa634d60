"""The ``edgefleet`` command's root. Each side hangs its commands here through the
``edgefleet.commands`` entry point group (pyproject.toml), so the root imports neither the agent
nor the control plane, and a device install that leaves the control plane out still runs.

Errors: a command answers wrong input with one ``Error: ...`` line on stderr and exit code 2
(click's usage errors: ``click.BadParameter``, ``click.UsageError``) or 1 (a failure:
``click.ClickException``). :func:`main` is the one safety net behind them: an exception no
command translated becomes ``Error: <type>: <message>`` and exit code 1, its traceback shown only
with ``--debug`` (or ``EDGEFLEET_DEBUG=1``). tests/test_cli_walk.py walks every command without it.
"""

from __future__ import annotations

import logging
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import click

from common import __version__

log = logging.getLogger("edgefleet.cli")


def _debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not log.handlers:
        log.addHandler(logging.StreamHandler())  # stderr
        log.setLevel(logging.DEBUG)


def root(invoked: str | None = None) -> click.Group:
    """The ``edgefleet`` command with the commands of every part installed here; with
    ``invoked`` (the command line's first word) naming a part whose one command has its name
    (``agent``, ``hardware``), only that part: a server starts without importing the others
    (the control plane's commands cost the agent's start about 25 ms)."""

    @click.group(name="edgefleet")
    @click.version_option(__version__, prog_name="edgefleet")
    @click.option(
        "--debug",
        is_flag=True,
        envvar="EDGEFLEET_DEBUG",
        expose_value=False,
        is_eager=True,
        callback=_debug,
        help="Show the traceback of an unexpected error (or set EDGEFLEET_DEBUG=1).",
    )
    def cli() -> None:
        """edgefleet: edge inference runtime with fleet management."""

    parts = list(entry_points(group="edgefleet.commands"))
    sole = [ep for ep in parts if ep.name == invoked]
    if sole and _register(cli, sole[0]):
        command = cli.commands.get(sole[0].name)
        if command is not None and not isinstance(command, SharedGroup):
            return cli  # a shared group (``models``): every part adds to it
        cli.commands.clear()
    for ep in parts:
        _register(cli, ep)
    return cli


def _register(cli: click.Group, ep: EntryPoint) -> bool:
    try:
        register = ep.load()
    except ImportError:
        return False  # a part not installed here (e.g. the control plane on a device)
    register(cli)
    return True


class SharedGroup(click.Group):
    """A group more than one part adds commands to (``models``, ``bundle``)."""


def subgroup(root: click.Group, name: str, help_text: str) -> click.Group:
    """The group ``name`` under ``root``, made on first use: both sides add to ``models``."""
    existing = root.commands.get(name)
    if isinstance(existing, click.Group):
        return existing
    group = SharedGroup(name, help=help_text)
    root.add_command(group)
    return group


class OneLineChoice(click.Choice[str]):
    """``click.Choice`` whose "missing" message is one line (click lists the choices one a
    line, and the ``Error:`` line would not be stderr's last): for required choices."""

    def get_missing_message(self, param: click.Parameter, ctx: click.Context | None) -> str:
        return f"Choose from: {', '.join(map(str, self.choices))}."


def one_line(text: str) -> str:
    """``text`` on one line: an ``Error:`` line is the last line of stderr, whole."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def settings_failure(exc: Exception, config_file: Path | None) -> click.ClickException:
    """A settings file or value that cannot be used, as one line: pydantic's errors as
    ``field: message``, a TOML syntax error with its file."""
    errors = getattr(exc, "errors", None)  # pydantic's ValidationError, not imported here
    if callable(errors):
        message = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in errors()
        )
    elif isinstance(exc, ValueError) and config_file is not None:  # tomllib.TOMLDecodeError
        message = f"{config_file}: {exc}"
    else:
        message = str(exc)
    return click.ClickException(f"invalid settings: {one_line(message)}")


def main() -> None:
    cli = root(sys.argv[1] if len(sys.argv) > 1 else None)
    log.propagate = False  # the traceback goes to --debug's handler only
    try:
        cli.main(prog_name="edgefleet")
    except Exception as exc:  # the last resort: each command translates what it expects
        log.debug("unexpected error", exc_info=exc)
        if logging.getLogger().handlers:
            # a server (agent, control plane) configured its JSON logs: the traceback goes
            # there too, where systemd's journal or kubectl logs keep it
            logging.getLogger("edgefleet").error("unexpected error, exiting", exc_info=exc)
        message = one_line(str(exc))
        click.echo(f"Error: {type(exc).__name__}" + (f": {message}" if message else ""), err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
