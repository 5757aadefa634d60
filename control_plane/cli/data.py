"""``edgefleet data``: the samples devices captured for retraining, listed and exported
(docs/model-quality.md, "Data capture").

``export`` writes one ``.npz`` per sample (``input:NAME`` and ``output:NAME`` arrays, as the
device captured them) and ``index.json`` describing each (device, time, trigger, rows, file),
and with ``--mlflow-run`` logs that folder as the run's artifacts (the ``edgefleet[mlflow]``
extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from common.cli import one_line
from control_plane.cli.api_client import Api, connected
from control_plane.registry.mlflow_source import MLFLOW_EXTRA

PAGE = 500


@click.group("data")
def data() -> None:
    """Samples devices captured for retraining ([capture] in a model's config)."""


def _pages(api: Api, model: str, version: int) -> list[dict[str, Any]]:
    path = f"/api/v1/models/{model}/versions/{version}/samples"
    out: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        doc = api.call("GET", path, params={"after": after, "limit": PAGE})
        out += doc["samples"]
        after = doc["next"]
    return out


@data.command("list")
@click.argument("model")
@click.option("--version", type=int, help="One version's samples (default: a line per version).")
@click.option("--json", "as_json", is_flag=True, help="Print the control plane's documents.")
@connected
def list_samples(model: str, version: int | None, as_json: bool) -> None:
    """The samples captured of MODEL: per version, or each of one version."""
    api = Api.connect()
    if version is None:
        doc = api.call("GET", f"/api/v1/models/{model}/samples")
        if as_json:
            click.echo(json.dumps(doc, indent=2))
        elif not doc["versions"]:
            click.echo(f"{model}: no samples captured")
        for v in [] if as_json else doc["versions"]:
            click.echo(
                f"{model} v{v['version']}: {v['samples']} samples, {v['bytes']} bytes, "
                f"{v['devices']} devices, {v['first']} .. {v['last']}"
            )
        return
    samples = _pages(api, model, version)
    if as_json:
        click.echo(json.dumps(samples, indent=2))
        return
    if not samples:
        click.echo(f"{model} v{version}: no samples captured")
    for s in samples:
        click.echo(
            f"{s['id']}  {s['captured_at']}  {s['device_id']}  {s['trigger']}  "
            f"{s['rows']} rows  {s['size_bytes']} bytes"
        )


@data.command("export")
@click.argument("model")
@click.option("--version", type=int, required=True, help="The version whose samples to export.")
@click.option(
    "--to",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="The folder to write (created if missing).",
)
@click.option("--mlflow-run", "run_id", help="Also log the folder as this MLflow run's artifacts.")
@click.option(
    "--mlflow-tracking-uri",
    envvar="MLFLOW_TRACKING_URI",
    help="The MLflow tracking server of --mlflow-run (or MLFLOW_TRACKING_URI).",
)
@connected
def export(
    model: str, version: int, folder: Path, run_id: str | None, mlflow_tracking_uri: str | None
) -> None:
    """Write MODEL VERSION's samples to a folder (one .npz each and index.json), and with
    --mlflow-run log it as that run's artifacts (under samples/MODEL-vVERSION)."""
    client = _mlflow_client(mlflow_tracking_uri) if run_id else None
    api = Api.connect()
    try:
        index = _write(api, model, version, folder)
    except OSError as exc:
        raise click.ClickException(f"--to {folder}: {exc.strerror or exc}") from exc
    if client is not None and run_id is not None:
        try:
            client.log_artifacts(run_id, str(folder), artifact_path=f"samples/{model}-v{version}")
        except Exception as exc:  # MlflowException, or the artifact store's own error
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            raise click.ClickException(f"MLflow run {run_id}: {one_line(message)}") from exc
    where = f"{folder}" + (f" and MLflow run {run_id}" if run_id else "")
    click.echo(f"exported {len(index)} samples of {model} v{version} to {where}")


def _write(api: Api, model: str, version: int, target: Path) -> list[dict[str, Any]]:
    samples = _pages(api, model, version)
    target.mkdir(parents=True, exist_ok=True)
    index = []
    for s in samples:
        name = f"{s['id']:08d}-{s['sample_id']}.npz"
        path = f"/api/v1/models/{model}/versions/{version}/samples/{s['id']}/data"
        (target / name).write_bytes(api.content(path))
        index.append({**s, "file": name})
    (target / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return index


def _mlflow_client(tracking_uri: str | None) -> Any:
    if not tracking_uri:
        raise click.UsageError("--mlflow-run needs MLFLOW_TRACKING_URI or --mlflow-tracking-uri")
    try:
        from mlflow import MlflowClient
    except ImportError as exc:
        raise click.ClickException(
            f"--mlflow-run needs the MLflow client ({exc}): {MLFLOW_EXTRA}"
        ) from exc
    return MlflowClient(tracking_uri=tracking_uri)
