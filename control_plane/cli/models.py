"""``edgefleet models push|list|validate|stage|discard|optimize|drift``: the model registry and
model quality, for operators (through the API). The agent's side of the group (``example``,
``selftest``) is :mod:`agent.cli`; both join the one ``models`` group (:mod:`control_plane.cli`
adds :data:`COMMANDS` to it)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from common.cli import OneLineChoice
from control_plane.cli.api_client import Api, connected
from control_plane.cli.io import json_document_option, print_doc, read_toml
from control_plane.registry.mlflow_source import MlflowSourceError, source_line

max_drop_option = click.option(
    "--max-accuracy-drop",
    type=click.FloatRange(0, 1),
    default=0.01,
    show_default=True,
    help="Refuse a variant whose accuracy on the reference set is more than this below FP32's "
    "(a fraction: 0.01 is one point); without labels, whose top-1 agreement is below 1 - this.",
)


config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML: serving config keys, and a [health] table for the device health window.",
)
mlflow_option = click.option(
    "--mlflow-tracking-uri",
    envvar="MLFLOW_TRACKING_URI",
    help="The MLflow registry models:/ sources are resolved against (or MLFLOW_TRACKING_URI).",
)


@click.command("push")
@click.argument("name")
@click.argument("version", type=int)
@click.argument("variants", nargs=-1, required=True)
@config_option
@click.option(
    "--reference",
    "reference_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Reference set (.npz: input:<name>, labels and/or output:<name>); INT8 and FP16 "
    "variants are then built per hardware profile and judged on it.",
)
@max_drop_option
@click.option("--no-optimise", is_flag=True, help="Keep the reference set but build no variants.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the version's document (progress: stderr)."
)
@mlflow_option
@connected
def push(
    name: str,
    version: int,
    variants: tuple[str, ...],
    config_file: Path | None,
    reference_file: Path | None,
    max_accuracy_drop: float,
    no_optimise: bool,
    as_json: bool,
    mlflow_tracking_uri: str | None,
) -> None:
    """Upload VERSION of NAME. Each VARIANT is a directory with the model file(s), optionally
    DIR@profile1,profile2 to reserve it for hardware profiles, or a model in an MLflow
    registry, models:/REGISTERED/VERSION or models:/REGISTERED@ALIAS (its ONNX flavour's
    file; docs/model-quality.md). A pipeline's files in a
    directory (pipeline.toml, pipeline_golden.npz, *.txt, *.py) go with its variant.
    golden.npz and validation.npz are taken from the first directory that has them. A
    generative model's folder (genai_config.json, its decoder, tokenizer files) is one variant
    of format genai, every file of it uploaded."""
    from control_plane.registry.mlflow_source import MlflowRegistry, ModelRef, is_model_uri

    config, health = serving_config(config_file)
    directories: list[tuple[Path, tuple[str, ...]]] = []
    source, shown = None, {}
    for item in variants:  # every source resolved before the version exists
        if not is_model_uri(item):
            path, _, profiles = item.partition("@")
            directories.append((Path(path), tuple(p for p in profiles.split(",") if p)))
            continue
        if source is not None:
            raise click.BadParameter("one models:/ source per version", param_hint="VARIANTS")
        scratch = click.get_current_context().with_resource(tempfile.TemporaryDirectory())
        with mlflow_errors():
            ref = ModelRef.parse(item)
            registry = MlflowRegistry(mlflow_tracking_uri)
            staged = registry.stage(ref, registry.resolve(ref), Path(scratch))
        directories += staged.variants
        source = staged.source
        shown = {d: ref.uri for d, _ in staged.variants}
    api = Api.connect()
    upload_version(
        api,
        name,
        version,
        directories,
        config=config,
        health=health,
        source=source,
        as_json=as_json,
        shown=shown,
    )
    if reference_file:
        with reference_file.open("rb") as fh:
            api.call("PUT", f"/api/v1/models/{name}/versions/{version}/reference", content=fh)
        click.echo(f"uploaded {reference_file} (reference set)", err=as_json)
        if not no_optimise:
            report = api.call(
                "POST",
                f"/api/v1/models/{name}/versions/{version}/optimise",
                json={"max_accuracy_drop": max_accuracy_drop},
            )
            echo_optimisation(report, err=as_json)
    if as_json:
        print_doc(api.call("GET", f"/api/v1/models/{name}/versions/{version}"), True)


@contextmanager
def mlflow_errors() -> Iterator[None]:
    """A ``models:/`` source's failure as this command's one-line error."""
    try:
        yield
    except MlflowSourceError as exc:
        raise click.ClickException(exc.message) from exc


def serving_config(config_file: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--config``'s serving keys and its [health] table."""
    config = read_toml(config_file, "--config") if config_file else {}
    health = config.pop("health", {})
    if not isinstance(health, dict):
        message = f"{config_file}: [health] is not a table"
        raise click.BadParameter(message, param_hint="--config")
    return config, health


def upload_version(
    api: Api,
    name: str,
    version: int,
    directories: list[tuple[Path, tuple[str, ...]]],
    *,
    config: dict[str, Any],
    health: dict[str, Any],
    source: dict[str, Any] | None,
    as_json: bool,
    shown: dict[Path, str] | None = None,
) -> None:
    """Create VERSION of NAME from variant directories (each checked first) and upload their
    files, golden.npz and validation.npz. ``shown``: what to call a directory in the progress
    lines (a staged MLflow model's scratch folder by its URI)."""

    def called(f: Path) -> str:
        return f"{(shown or {})[f.parent]}: {f.name}" if f.parent in (shown or {}) else str(f)

    specs, dirs = [], []
    for directory, profiles in directories:
        fmt_name, files = variant_files(directory)
        specs.append({"format": fmt_name, "profiles": list(profiles)})
        dirs.append((directory, files))
    body: dict[str, Any] = {"version": version, "variants": specs, "config": config}
    body["health"] = health
    if source is not None:
        body["source"] = source
    api.call("POST", f"/api/v1/models/{name}/versions", json=body)
    try:
        for index, (_, files) in enumerate(dirs):
            for f in files:
                with f.open("rb") as fh:
                    done = api.call(
                        "PUT",
                        f"/api/v1/models/{name}/versions/{version}/variants/{index}/files/{f.name}",
                        content=fh,
                    )
                click.echo(
                    f"uploaded {called(f)} ({done['size']} bytes, sha256 {done['sha256'][:12]})",
                    err=as_json,
                )
        for sample, route in (("golden.npz", "golden"), ("validation.npz", "validation-data")):
            found = next((d / sample for d, _ in dirs if (d / sample).is_file()), None)
            if found:
                with found.open("rb") as fh:
                    api.call("PUT", f"/api/v1/models/{name}/versions/{version}/{route}", content=fh)
                click.echo(f"uploaded {called(found)}", err=as_json)
    except OSError as exc:  # a file that went away, or cannot be read, since the check
        raise click.ClickException(f"cannot read {exc.filename}: {exc.strerror}") from exc


def variant_files(directory: Path) -> tuple[str, list[Path]]:
    """:func:`control_plane.registry.variant_dirs.variant_files`, or a BadParameter naming
    what is wrong."""
    from control_plane.registry.variant_dirs import variant_files as read_variant
    from runtimes.errors import ModelFileError

    try:
        return read_variant(directory)
    except (ModelFileError, OSError) as exc:
        raise click.BadParameter(str(exc), param_hint="VARIANTS") from exc


@click.command("list")
@click.option("--archived", is_flag=True, help="Show archived versions too.")
@json_document_option
@connected
def list_models(archived: bool, as_json: bool) -> None:
    """Models in the registry with their versions and stages (archived ones hidden)."""
    query = "?archived=true" if archived else ""
    doc = Api.connect().call("GET", f"/api/v1/models{query}")
    if as_json:
        print_doc(doc, True)
        return
    for m in doc:
        versions = ", ".join(
            f"v{v['version']} {v['stage']}"
            + {True: " (valid)", False: " (INVALID)", None: ""}[v["validated"]]
            for v in m["versions"]
        )
        click.echo(f"{m['name']}: {versions}")
        for v in m["versions"]:
            if v.get("source"):
                click.echo(f"  v{v['version']} from {source_line(v['source'])}")
            for i, variant in enumerate(v["variants"]):
                if variant["kind"] != "fp32" or variant.get("measured"):
                    click.echo(f"  v{v['version']} variant {i}: {variant_line(variant)}")


@click.command("validate")
@click.argument("name")
@click.argument("version", type=int)
@json_document_option
@connected
def validate(name: str, version: int, as_json: bool) -> None:
    """Validate a version: loads on its runtimes, agreement, golden, accuracy. Exit code 1
    when it fails."""
    report = Api.connect().call("POST", f"/api/v1/models/{name}/versions/{version}/validate")
    if as_json:
        print_doc(report, True)
    else:
        for c in report["checks"]:
            click.echo(
                f"{'PASS' if c['passed'] else 'FAIL'}  {c['check']}"
                + (f"  ({c['detail']})" if c["detail"] else "")
            )
        click.echo("passed" if report["passed"] else "FAILED")
    if not report["passed"]:
        raise click.ClickException(f"{name} v{version} failed validation")


@click.command("stage")
@click.argument("name")
@click.argument("version", type=int)
@click.argument("stage", type=OneLineChoice(["candidate", "production", "retired", "archived"]))
@json_document_option
@connected
def stage(name: str, version: int, stage: str, as_json: bool) -> None:
    """Label a version candidate, production, retired or archived (hidden from listings
    and rollouts: for a version that failed validation, say)."""
    doc = Api.connect().call(
        "POST", f"/api/v1/models/{name}/versions/{version}/stage", json={"stage": stage}
    )
    print_doc(doc if as_json else f"{doc['model']} v{doc['version']}: {doc['stage']}", as_json)


@click.command("discard")
@click.argument("name")
@click.argument("version", type=int)
@json_document_option
@connected
def discard(name: str, version: int, as_json: bool) -> None:
    """Discard an unfinished push of VERSION (its number is free again); a complete
    version is immutable: archive it instead."""
    doc = Api.connect().call("DELETE", f"/api/v1/models/{name}/versions/{version}")
    print_doc(doc if as_json else f"{name} v{version}: discarded", as_json)


@click.command("optimize")
@click.argument("name")
@click.argument("version", type=int)
@max_drop_option
@click.option("--json", "as_json", is_flag=True, help="Print the control plane's report.")
@connected
def optimize(name: str, version: int, max_accuracy_drop: float, as_json: bool) -> None:
    """Build INT8 (CPU profiles), FP16 (GPU profiles) and OpenVINO INT8 variants of a
    candidate version from its FP32 ONNX variant, each judged on the version's reference
    set; one past --max-accuracy-drop is refused, with its numbers."""
    report = Api.connect().call(
        "POST",
        f"/api/v1/models/{name}/versions/{version}/optimise",
        json={"max_accuracy_drop": max_accuracy_drop},
    )
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        echo_optimisation(report, err=False)


@click.command("drift")
@click.argument("name")
@click.argument("version", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the control plane's document.")
@connected
def drift(name: str, version: int, as_json: bool) -> None:
    """Input drift of a version against its reference set: the fleet's recent windows
    and each device's, worst first (largest PSI of any feature, KS, Wasserstein)."""
    doc = Api.connect().call("GET", f"/api/v1/models/{name}/versions/{version}/drift")
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    rows = [r for r in (doc["fleet"], *doc["devices"]) if r is not None]
    if not rows:
        why = "" if doc["reference"] else ": the version has no reference set"
        click.echo(f"{name} v{version}: no drift judged yet{why}")
    for r in rows:
        where = "fleet" if r["device_id"] == "*" else r["device_id"]
        flag = f"OVER {doc['psi_threshold']:g}" if r["over_threshold"] else "ok"
        click.echo(
            f"{where}: {flag}  PSI {r['psi']:.3f} on {r['feature']}, KS {r['ks']:.3f}, "
            f"Wasserstein {r['wasserstein']:.3g}; {r['rows']:.0f} rows, "
            f"{r['windows']} windows"
        )


def variant_line(variant: dict[str, Any]) -> str:
    """One variant as `models list` prints it: for an optimised one its accuracy against FP32,
    and the rows per second devices measured serving it (their batch tuning)."""
    delta = variant["accuracy_delta"]
    profiles = ",".join(variant["profiles"]) or "any profile"
    parts = []
    if delta is not None:
        parts.append(f"accuracy {delta * 100:+.2f} points")
    elif variant.get("agreement") is not None:
        parts.append(f"agreement {variant['agreement']:.2%}")
    if variant.get("max_abs_diff") is not None:
        parts.append(f"max abs diff {variant['max_abs_diff']:.3g}")
    parts += [
        f"measured {m['rows_per_s']:,.0f} rows/s on {m['profile']} (batch {m['batch_size']})"
        for m in variant.get("measured", [])
    ]
    return f"{variant['kind']} for {profiles}: {', '.join(parts) or 'not measured'}"


def echo_optimisation(report: dict[str, Any], *, err: bool) -> None:
    for r in report["results"]:
        line = f"{r['kind']}: {r['outcome']}"
        if r["outcome"] == "built":
            line += f" as variant {r['variant']} for {','.join(r['profiles'])}"
            if r.get("accuracy") is not None:
                line += (
                    f"; accuracy {r['accuracy']:.4f} vs FP32 {r['accuracy_fp32']:.4f} "
                    f"({r['accuracy_delta'] * 100:+.2f} points)"
                )
        elif r.get("reason"):  # a refusal's reason holds its accuracy or agreement
            line += f": {r['reason']}"
        if r.get("agreement") is not None:
            line += f"; agreement {r['agreement']:.4f}; max abs diff {r['max_abs_diff']:.3g}"
        click.echo(line, err=err)


COMMANDS = (push, list_models, validate, stage, discard, optimize, drift)
"""The control plane's commands of ``edgefleet models``."""
