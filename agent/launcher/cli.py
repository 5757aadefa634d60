"""``edgefleet launcher ...``: run the agent under the launcher, install a release beside the
current one and put it on trial, show the journal, and retry a rolled-back release."""

from __future__ import annotations

import os
import signal
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from common.cli import settings_failure

if TYPE_CHECKING:
    from agent.launcher.journal import Journal
    from agent.launcher.settings import LauncherSettings

_ROOT = click.option(
    "--root",
    "root_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The launcher's folder (default: settings' root_dir, /var/lib/edgefleet/launcher).",
)
_CONFIG = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML settings file (EDGEFLEET_LAUNCHER_* variables and flags override it).",
)


def _settings(config_file: Path | None, **flags: object) -> LauncherSettings:
    from pydantic import ValidationError

    from agent.launcher.settings import LauncherSettings
    from common.settings import settings_from

    try:
        return settings_from(LauncherSettings, config_file, **flags)
    except (ValidationError, FileNotFoundError, tomllib.TOMLDecodeError) as exc:
        raise settings_failure(exc, config_file) from exc


@contextmanager
def _files() -> Iterator[None]:
    """A folder that cannot be made or read (below a file, not writable) as one error line."""
    try:
        yield
    except OSError as exc:
        raise click.ClickException(f"{exc.filename}: {exc.strerror}") from exc


def _journal(root: Path) -> Journal:
    from agent.launcher.journal import JournalError, load_journal

    try:
        return load_journal(root / "launcher.json")
    except JournalError as exc:
        raise click.ClickException(str(exc)) from exc


def _ask(root: Path, version: str, retry: bool) -> None:
    """Write pending.json and wake the launcher (SIGHUP), if it runs."""
    from agent.launcher.journal import PendingRelease, save_pending

    save_pending(root, PendingRelease(version=version, retry=retry))
    pid = _journal(root).launcher_pid
    if pid and _is_launcher(pid):
        os.kill(pid, signal.SIGHUP)
        click.echo(f"asked the launcher (pid {pid}) to put {version} on trial")
        return
    click.echo(f"{version} goes on trial when the launcher starts")


def _is_launcher(pid: int) -> bool:
    """Whether ``pid`` still is a launcher: the journal's pid may be a killed launcher's, and
    reused since by another process, which a SIGHUP could end."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"launcher" in words and b"run" in words


def register_launcher(group: click.Group) -> None:
    launcher = click.Group("launcher", help="Run the agent with trial, rollback and back-off.")
    group.add_command(launcher)

    @launcher.command("run")
    @_ROOT
    @_CONFIG
    @click.argument("agent_args", nargs=-1, type=click.UNPROCESSED)
    def run(root_dir: Path | None, config_file: Path | None, agent_args: tuple[str, ...]) -> None:
        """Run the current release's agent (AGENT_ARGS: its edgefleet command line, after
        --), restart it when it exits, and put a pending release on trial."""
        from agent.launcher.launcher import Launcher
        from agent.launcher.notify import Upstream
        from common.logs import configure_logging

        settings = _settings(config_file, root_dir=root_dir, agent_args=list(agent_args) or None)
        configure_logging(settings.log_level)
        # systemd's variables are its protocol, not settings: read (and unset) here, once
        upstream = Upstream.from_environment(os.environ)
        with _files():
            code = Launcher(settings, os.environ, upstream).run()
        raise SystemExit(code)

    @launcher.command("install")
    @_ROOT
    @_CONFIG
    @click.argument("source", type=click.Path(exists=True, path_type=Path))
    @click.option("--no-trial", is_flag=True, help="Only install it beside the others.")
    def install(
        root_dir: Path | None, config_file: Path | None, source: Path, no_trial: bool
    ) -> None:
        """Install a release (a folder with release.json, or a .tar.gz of one) and put it on
        trial."""
        from agent.launcher.releases import ReleaseError, Releases

        settings = _settings(config_file, root_dir=root_dir)
        with _files():
            try:
                info = Releases(settings.releases_dir).install(source)
            except ReleaseError as exc:
                raise click.ClickException(str(exc)) from exc
            click.echo(f"installed {info.version} in {settings.releases_dir / info.version}")
            if not no_trial:
                _ask(settings.root_dir, info.version, retry=False)

    @launcher.command("retry")
    @_ROOT
    @_CONFIG
    @click.argument("version")
    def retry(root_dir: Path | None, config_file: Path | None, version: str) -> None:
        """Put a release that failed its trial on trial again."""
        from agent.launcher.releases import Releases

        settings = _settings(config_file, root_dir=root_dir)
        if not Releases(settings.releases_dir).installed(version):
            raise click.BadParameter(f"release {version} is not installed", param_hint="VERSION")
        with _files():
            _ask(settings.root_dir, version, retry=True)

    @launcher.command("status")
    @_ROOT
    @_CONFIG
    @click.option("--json", "as_json", is_flag=True, help="Print the journal as JSON.")
    def status(root_dir: Path | None, config_file: Path | None, as_json: bool) -> None:
        """Show the current and previous release, the trial and the last outcome."""
        settings = _settings(config_file, root_dir=root_dir)
        if not settings.journal_file.is_file():
            raise click.ClickException(
                f"no launcher journal at {settings.journal_file}: no launcher ran with this root"
            )
        with _files():
            journal = _journal(settings.root_dir)
        if as_json:
            click.echo(journal.model_dump_json(indent=2))
            return
        click.echo(f"current:  {journal.current} ({journal.phase})")
        click.echo(f"previous: {journal.previous or '-'}")
        if journal.trial:
            t = journal.trial
            click.echo(f"trial:    {t.version}, launch {t.launches}, back to {t.previous}")
        if journal.last_error:
            click.echo(f"error:    {journal.last_error} ({journal.exits_in_a_row} in a row)")
        if journal.last_outcome:
            o = journal.last_outcome
            why = f": {o.reason}" if o.reason else ""
            click.echo(f"last:     {o.version} {o.outcome}{why}")
        for version, reason in sorted(journal.failed.items()):
            click.echo(f"failed:   {version}: {reason}")

    del run, install, retry, status
