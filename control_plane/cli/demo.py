"""``edgefleet demo``: the whole story on one machine (:mod:`control_plane.demo` runs it)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("demo")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("var/demo"),
    show_default=True,
    help="Where the demo writes its files (emptied first).",
)
@click.option("--mqtt", "mqtt_url", help="Use this broker instead of starting a private Mosquitto.")
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
