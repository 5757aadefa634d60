"""The ``edgefleet`` command's root. Each side hangs its commands here through the
``edgefleet.commands`` entry point group (pyproject.toml), so the root imports neither the agent
nor the control plane, and a device install that leaves the control plane out still runs."""

from __future__ import annotations

from importlib.metadata import entry_points

import click

from common import __version__


@click.group()
@click.version_option(__version__, prog_name="edgefleet")
def cli() -> None:
    """edgefleet: edge inference runtime with fleet management."""


def subgroup(root: click.Group, name: str, help_text: str) -> click.Group:
    """The group ``name`` under ``root``, made on first use: both sides add to ``models``."""
    existing = root.commands.get(name)
    if isinstance(existing, click.Group):
        return existing
    group = click.Group(name, help=help_text)
    root.add_command(group)
    return group


def main() -> None:
    for ep in entry_points(group="edgefleet.commands"):
        try:
            register = ep.load()
        except ImportError:
            continue  # a part not installed here (e.g. the control plane on a device)
        register(cli)
    cli()


if __name__ == "__main__":
    main()
