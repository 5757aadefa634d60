"""``edgefleet models sync NAME --from models:/REGISTERED@ALIAS``: follow an MLflow alias.

Each check resolves the alias once. When it points at an MLflow version that no version of
NAME was pushed from (their recorded ``source``, archived versions included), that version is
pushed as NAME's next version number, as ``models push`` would push it, and validated: a
candidate ready to roll out. Otherwise NAME is up to date and nothing is sent (unless the
version that came from it is a push that never finished: that is an error naming the discard
to run). With
``--interval-s`` it checks again until stopped (``--rounds`` bounds it); a check that fails
(MLflow unreachable, a push refused) is reported on one line and the next check goes on.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import click

from control_plane.cli.api_client import Api, connected
from control_plane.cli.models import (
    config_option,
    mlflow_errors,
    mlflow_option,
    serving_config,
    upload_version,
)
from control_plane.registry.mlflow_source import MlflowRegistry, ModelRef, pushed_from, source_line


@click.command("sync")
@click.argument("name")
@click.option(
    "--from",
    "from_uri",
    required=True,
    help="The MLflow model to follow: models:/REGISTERED@ALIAS (or models:/REGISTERED/VERSION).",
)
@config_option
@click.option(
    "--interval-s",
    type=click.FloatRange(min=0.1),
    help="Check again every this many seconds, until stopped (Ctrl-C).",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    help="With --interval-s: stop after this many checks.",
)
@mlflow_option
@connected
def sync(
    name: str,
    from_uri: str,
    config_file: Path | None,
    interval_s: float | None,
    rounds: int | None,
    mlflow_tracking_uri: str | None,
) -> None:
    """Push the MLflow version an alias points at as NAME's next version, validated, unless
    a version of NAME came from it already (then: up to date). Exit code 1 when a single
    check fails or its version fails validation."""
    if rounds is not None and interval_s is None:
        raise click.UsageError("--rounds bounds --interval-s: give both, or neither")
    with mlflow_errors():
        ref = ModelRef.parse(from_uri)
    config, health = serving_config(config_file)
    api = Api.connect()
    _versions(api, name)  # the control plane first: is it there, is the token good
    with mlflow_errors():
        registry = MlflowRegistry(mlflow_tracking_uri)
    if interval_s is None:
        check(api, registry, ref, name, config, health)
        return
    done = 0
    try:
        while rounds is None or done < rounds:
            if done:
                time.sleep(interval_s)  # the follow interval, not a readiness wait
            try:
                check(api, registry, ref, name, config, health)
            except click.ClickException as exc:  # this check failed; the next may not
                click.echo(f"Error: {exc.format_message()}", err=True)
            done += 1
    except KeyboardInterrupt:
        click.echo(f"stopped following {ref.uri}", err=True)


def check(
    api: Api,
    registry: MlflowRegistry,
    ref: ModelRef,
    name: str,
    config: dict[str, Any],
    health: dict[str, Any],
) -> None:
    """One check: push and validate what the alias points at if it is new; a version that
    fails validation is kept (archive it) and reported as a failure."""
    with mlflow_errors():
        found = registry.resolve(ref)
    versions = _versions(api, name)
    done = pushed_from(versions, found)
    if done is not None:
        _up_to_date(api, name, done["version"], done["source"], done["validated"])
        return
    version = max((v["version"] for v in versions), default=0) + 1
    with tempfile.TemporaryDirectory() as scratch, mlflow_errors():
        staged = registry.stage(ref, found, Path(scratch))
        upload_version(
            api,
            name,
            version,
            staged.variants,
            config=config,
            health=health,
            source=staged.source,
            as_json=True,  # the upload lines on stderr; stdout says what changed
            shown={d: ref.uri for d, _ in staged.variants},
        )
    report = api.call("POST", f"/api/v1/models/{name}/versions/{version}/validate")
    outcome = "passed validation" if report["passed"] else "FAILED validation"
    failed = "; ".join(f"{c['check']}: {c['detail']}" for c in report["checks"] if not c["passed"])
    click.echo(
        f"{name} v{version}: pushed from {source_line(staged.source)}; {outcome}"
        + (f" ({failed})" if failed else "")
    )
    if not report["passed"]:
        raise click.ClickException(f"{name} v{version} failed validation")


def _up_to_date(
    api: Api, name: str, number: int, source: dict[str, Any], validated: bool | None
) -> None:
    """Say that NAME vNUMBER came from what the alias points at, unless that push never
    finished (its client died): then the version holds no model, and saying so is the answer."""
    doc = api.call("GET", f"/api/v1/models/{name}/versions/{number}")
    if not doc["complete"]:
        raise click.ClickException(
            f"{name} v{number} is an unfinished push of {source_line(source)}: discard it "
            f"(edgefleet models discard {name} {number}) and sync again"
        )
    note = {False: " (it FAILED validation)", None: " (not validated)"}.get(validated, "")
    click.echo(f"{name} is up to date: v{number} is {source_line(source)}{note}")


def _versions(api: Api, name: str) -> list[dict[str, Any]]:
    """NAME's versions (archived ones too) as ``GET /api/v1/models`` lists them."""
    models = api.call("GET", "/api/v1/models?archived=true")
    found = next((m for m in models if m["name"] == name), None)
    return list((found or {}).get("versions", []))
