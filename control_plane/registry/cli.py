"""``edgefleet models push|list|validate|stage|discard``: the model registry, for operators
(through the API). The quality commands (``models optimise``, ``models drift``, ...) are
:mod:`control_plane.quality.cli`."""

from __future__ import annotations

from pathlib import Path

import click

from common.cli import OneLineChoice
from control_plane.api_client import Api, connected
from control_plane.cli_io import print_doc, read_toml
from control_plane.quality.cli import echo_optimisation, max_drop_option, variant_line


def register_model_commands(models: click.Group) -> None:
    as_json_option = click.option(
        "--json", "as_json", is_flag=True, help="Print the control plane's JSON document."
    )

    @models.command("push")
    @click.argument("name")
    @click.argument("version", type=int)
    @click.argument("variants", nargs=-1, required=True)
    @click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="TOML: serving config keys, and a [health] table for the device health window.",
    )
    @click.option(
        "--reference",
        "reference_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Reference set (.npz: input:<name>, labels and/or output:<name>); INT8 and FP16 "
        "variants are then built per hardware profile and judged on it.",
    )
    @max_drop_option
    @click.option(
        "--no-optimise", is_flag=True, help="Keep the reference set but build no variants."
    )
    @click.option(
        "--json", "as_json", is_flag=True, help="Print the version's document (progress: stderr)."
    )
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
    ) -> None:
        """Upload VERSION of NAME. Each VARIANT is a directory with the model file(s), optionally
        DIR@profile1,profile2 to reserve it for hardware profiles. A pipeline's files in a
        directory (pipeline.toml, pipeline_golden.npz, *.txt, *.py) go with its variant.
        golden.npz and validation.npz are taken from the first directory that has them."""
        from common.pipeline_config import PIPELINE_FILES
        from runtimes.errors import ModelFileError
        from runtimes.formats import find_model_file

        config = read_toml(config_file, "--config") if config_file else {}
        health = config.pop("health", {})
        if not isinstance(health, dict):
            message = f"{config_file}: [health] is not a table"
            raise click.BadParameter(message, param_hint="--config")
        specs, dirs = [], []
        for item in variants:  # every directory checked before the version exists
            path, _, profiles = item.partition("@")
            directory = Path(path)
            try:
                model_file, fmt = find_model_file(directory)
            except (ModelFileError, OSError) as exc:
                raise click.BadParameter(str(exc), param_hint="VARIANTS") from exc
            # a pipeline's files first: the model file completes the variant
            files = sorted(f for f in directory.iterdir() if PIPELINE_FILES.match(f.name))
            files += [model_file] + (
                [model_file.with_suffix(".bin")] if fmt.value == "openvino_ir" else []
            )
            specs.append({"format": fmt.value, "profiles": [p for p in profiles.split(",") if p]})
            dirs.append((directory, files))
        api = Api.connect()
        api.call(
            "POST",
            f"/api/v1/models/{name}/versions",
            json={"version": version, "variants": specs, "config": config, "health": health},
        )
        try:
            for index, (_, files) in enumerate(dirs):
                for f in files:
                    with f.open("rb") as fh:
                        done = api.call(
                            "PUT",
                            f"/api/v1/models/{name}/versions/{version}/variants/{index}/files/"
                            f"{f.name}",
                            content=fh,
                        )
                    click.echo(
                        f"uploaded {f} ({done['size']} bytes, sha256 {done['sha256'][:12]})",
                        err=as_json,
                    )
            for sample, route in (("golden.npz", "golden"), ("validation.npz", "validation-data")):
                found = next((d / sample for d, _ in dirs if (d / sample).is_file()), None)
                if found:
                    with found.open("rb") as fh:
                        api.call(
                            "PUT", f"/api/v1/models/{name}/versions/{version}/{route}", content=fh
                        )
                    click.echo(f"uploaded {found}", err=as_json)
            if reference_file:
                with reference_file.open("rb") as fh:
                    api.call(
                        "PUT", f"/api/v1/models/{name}/versions/{version}/reference", content=fh
                    )
                click.echo(f"uploaded {reference_file} (reference set)", err=as_json)
        except OSError as exc:  # a file that went away, or cannot be read, since the check
            raise click.ClickException(f"cannot read {exc.filename}: {exc.strerror}") from exc
        if reference_file and not no_optimise:
            report = api.call(
                "POST",
                f"/api/v1/models/{name}/versions/{version}/optimise",
                json={"max_accuracy_drop": max_accuracy_drop},
            )
            echo_optimisation(report, err=as_json)
        if as_json:
            print_doc(api.call("GET", f"/api/v1/models/{name}/versions/{version}"), True)

    @models.command("list")
    @click.option("--archived", is_flag=True, help="Show archived versions too.")
    @as_json_option
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
                for i, variant in enumerate(v["variants"]):
                    if variant["kind"] != "fp32" or variant.get("measured"):
                        click.echo(f"  v{v['version']} variant {i}: {variant_line(variant)}")

    @models.command("validate")
    @click.argument("name")
    @click.argument("version", type=int)
    @as_json_option
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

    @models.command("stage")
    @click.argument("name")
    @click.argument("version", type=int)
    @click.argument("stage", type=OneLineChoice(["candidate", "production", "retired", "archived"]))
    @as_json_option
    @connected
    def stage(name: str, version: int, stage: str, as_json: bool) -> None:
        """Label a version candidate, production, retired or archived (hidden from listings
        and rollouts: for a version that failed validation, say)."""
        doc = Api.connect().call(
            "POST", f"/api/v1/models/{name}/versions/{version}/stage", json={"stage": stage}
        )
        print_doc(doc if as_json else f"{doc['model']} v{doc['version']}: {doc['stage']}", as_json)

    @models.command("discard")
    @click.argument("name")
    @click.argument("version", type=int)
    @as_json_option
    @connected
    def discard(name: str, version: int, as_json: bool) -> None:
        """Discard an unfinished push of VERSION (its number is free again); a complete
        version is immutable: archive it instead."""
        doc = Api.connect().call("DELETE", f"/api/v1/models/{name}/versions/{version}")
        print_doc(doc if as_json else f"{name} v{version}: discarded", as_json)

    del push, list_models, validate, stage, discard
