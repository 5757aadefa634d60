"""``edgefleet control-plane`` (the service) and the operator commands, which speak to its API
through :mod:`control_plane.api_client` (how a command finds the control plane and its token is
said there)."""

from __future__ import annotations

import json
import time
import tomllib
from pathlib import Path
from typing import Any

import click

from common.cli import OneLineChoice, one_line, settings_failure, subgroup
from control_plane.api_client import Api, connected
from control_plane.device_view import device_lines
from control_plane.provisioning.cli import register_fleet
from control_plane.quality.cli import (
    echo_optimisation,
    max_drop_option,
    register_quality_commands,
    variant_line,
)
from control_plane.rollouts.states import FINISHED
from control_plane.status_view import status_lines


def _print(doc: Any, as_json: bool) -> None:
    click.echo(json.dumps(doc, indent=2) if as_json else doc)


def _pairs(values: tuple[str, ...], param: str, expected: str) -> dict[str, str]:
    """``key=value`` arguments as a dict (the value may be empty)."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected {expected}, got {item!r}", param_hint=param)
        out[key] = value
    return out


def _toml(path: Path, param: str) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint=param) from exc
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror or exc}", param_hint=param) from exc


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
        _print({"name": name, "role": role, "token": made} if as_json else made, as_json)

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
    rollouts = subgroup(root, "rollouts", "Staged rollouts.")
    devices = subgroup(root, "devices", "The device inventory.")
    keys = subgroup(root, "keys", "Signing keys and the trust root.")
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

        config = _toml(config_file, "--config") if config_file else {}
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
            _print(api.call("GET", f"/api/v1/models/{name}/versions/{version}"), True)

    @models.command("list")
    @click.option("--archived", is_flag=True, help="Show archived versions too.")
    @as_json_option
    @connected
    def list_models(archived: bool, as_json: bool) -> None:
        """Models in the registry with their versions and stages (archived ones hidden)."""
        query = "?archived=true" if archived else ""
        doc = Api.connect().call("GET", f"/api/v1/models{query}")
        if as_json:
            _print(doc, True)
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
            _print(report, True)
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
        _print(doc if as_json else f"{doc['model']} v{doc['version']}: {doc['stage']}", as_json)

    @models.command("discard")
    @click.argument("name")
    @click.argument("version", type=int)
    @as_json_option
    @connected
    def discard(name: str, version: int, as_json: bool) -> None:
        """Discard an unfinished push of VERSION (its number is free again); a complete
        version is immutable: archive it instead."""
        doc = Api.connect().call("DELETE", f"/api/v1/models/{name}/versions/{version}")
        _print(doc if as_json else f"{name} v{version}: discarded", as_json)

    @rollouts.command("create")
    @click.option("--model", required=True)
    @click.option("--version", type=int, required=True)
    @click.option("--selector", multiple=True, help="label=value (repeatable)")
    @click.option("--profile", "profiles", multiple=True)
    @click.option("--waves", default="1,10%,50%,100%", show_default=True)
    @click.option(
        "--bake-time", type=float, default=60.0, show_default=True, help="seconds per wave"
    )
    @click.option("--device-timeout", type=float, default=600.0, show_default=True)
    @click.option("--max-error-rate", type=float, default=0.01, show_default=True)
    @click.option("--max-p99-ratio", type=float, default=2.0, show_default=True)
    @click.option("--min-requests", type=int, default=20, show_default=True)
    @click.option("--max-rejections", type=int, default=0, show_default=True)
    @click.option(
        "--allow-unjudged",
        is_flag=True,
        help="Pass a wave with too few requests to judge at the end of its bake (by default "
        "it waits for traffic).",
    )
    @click.option(
        "--max-drift",
        type=click.FloatRange(min=0, min_open=True),
        help="Pause (not roll back) when the input drift (largest PSI of any feature against "
        "the version's reference set) on the waves' devices passes this; 0.2 is a common "
        "threshold. Off by default.",
    )
    @click.option(
        "--shadow",
        "shadow_share",
        type=float,
        default=None,
        help="Begin each wave with a shadow phase: its devices stage the candidate unswitched "
        "and copy it this share (0-1) of their live requests.",
    )
    @click.option(
        "--min-agreement",
        type=float,
        default=0.99,
        show_default=True,
        help="Shadow: top-1 agreement with the serving version a wave needs to switch.",
    )
    @click.option("--shadow-min-requests", type=int, default=100, show_default=True)
    @click.option("--shadow-timeout", type=float, default=3600.0, show_default=True, help="seconds")
    @click.option(
        "--json", "as_json", is_flag=True, help="Print the created rollout's document (its id)."
    )
    @connected
    def create(
        model: str,
        version: int,
        selector: tuple[str, ...],
        profiles: tuple[str, ...],
        waves: str,
        bake_time: float,
        device_timeout: float,
        max_error_rate: float,
        max_p99_ratio: float,
        min_requests: int,
        max_rejections: int,
        allow_unjudged: bool,
        max_drift: float | None,
        shadow_share: float | None,
        min_agreement: float,
        shadow_min_requests: int,
        shadow_timeout: float,
        as_json: bool,
    ) -> None:
        """Start a staged rollout."""
        spec: dict[str, Any] = {
            "model": model,
            "version": version,
            "selector": _pairs(selector, "--selector", "label=value"),
            "profiles": list(profiles),
            "waves": waves.split(","),
            "bake_time_s": bake_time,
            "device_timeout_s": device_timeout,
            "gates": {
                "max_error_rate": max_error_rate,
                "max_p99_ratio": max_p99_ratio,
                "min_requests": min_requests,
                "max_rejections": max_rejections,
                "allow_unjudged": allow_unjudged,
                "max_drift": max_drift,
            },
        }
        if shadow_share is not None:
            spec["shadow"] = {
                "sample_share": shadow_share,
                "min_agreement": min_agreement,
                "min_requests": shadow_min_requests,
                "timeout_s": shadow_timeout,
            }
        doc = Api.connect().call("POST", "/api/v1/rollouts", json=spec)
        if as_json:
            _print(doc, True)
            return
        click.echo(
            f"rollout {doc['id']}: {doc['state']}, "
            f"{sum(w['devices'] for w in doc['waves'])} devices "
            f"in {len(doc['waves'])} waves"
        )

    @rollouts.command("list")
    @click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
    @click.option(
        "--before",
        type=click.IntRange(1, 2**31 - 1),
        help="Only rollouts older than this id (the last one of the previous page).",
    )
    @as_json_option
    @connected
    def list_rollouts(limit: int, before: int | None, as_json: bool) -> None:
        """Rollouts, newest first."""
        params = {"limit": limit, **({"before": before} if before else {})}
        doc = Api.connect().call("GET", "/api/v1/rollouts", params=params)
        if as_json:
            _print(doc, True)
            return
        for r in doc:
            click.echo(
                f"rollout {r['id']}: {r['model']} v{r['version']} {r['state']}"
                + (f" ({r['reason']})" if r["reason"] else "")
                + f", {sum(w['devices'] for w in r['waves'])} devices, created {r['created_at']}"
            )

    @rollouts.command("status")
    @click.argument("rollout_id", type=int)
    @click.option("--watch", is_flag=True, help="Follow it, redrawn every second, until it ends.")
    @as_json_option
    @connected
    def status(rollout_id: int, watch: bool, as_json: bool) -> None:
        """Progress of a rollout: per wave, each device's phase, the bake's countdown and the
        gates' verdict."""
        api = Api.connect()
        doc = api.call("GET", f"/api/v1/rollouts/{rollout_id}")
        if as_json:
            _print(doc, True)
            return
        if not watch:
            _show(doc)
            return
        from rich.live import Live
        from rich.text import Text

        with Live(Text("\n".join(status_lines(doc))), auto_refresh=False) as live:
            while doc["state"] not in FINISHED:
                time.sleep(1)
                doc = api.call("GET", f"/api/v1/rollouts/{rollout_id}")
                live.update(Text("\n".join(status_lines(doc))), refresh=True)
        click.echo(
            f"rollout {rollout_id}: {doc['state']}"
            + (f": {doc['reason']}" if doc["reason"] else "")
        )

    for action in ("pause", "resume", "abort", "cancel"):

        def make(action: str = action) -> None:
            @rollouts.command(
                action,
                help=f"{action.capitalize()} a rollout"
                + (" and roll back every device it touched." if action == "abort" else "."),
            )
            @click.argument("rollout_id", type=int)
            @as_json_option
            @connected
            def act(rollout_id: int, as_json: bool) -> None:
                doc = Api.connect().call("POST", f"/api/v1/rollouts/{rollout_id}/{action}")
                _print(doc if as_json else f"rollout {rollout_id}: {doc['state']}", as_json)

        make()

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
        _pairs(label, "--label", "key=value")
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
            _print(doc, True)
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
        _print(doc if as_json else "\n".join(device_lines(doc)), as_json)

    @devices.command("label")
    @click.argument("device_id")
    @click.argument("labels", nargs=-1, required=True)
    @click.option("--json", "as_json", is_flag=True, help="Print the device's document.")
    @connected
    def label(device_id: str, labels: tuple[str, ...], as_json: bool) -> None:
        """Set operator labels (key=value), or remove one (key=)."""
        pairs = _pairs(labels, "LABELS", "key=value, or key= to remove it")
        changes = {k: (v or None) for k, v in pairs.items()}
        doc = Api.connect().call(
            "PATCH", f"/api/v1/devices/{device_id}/labels", json={"labels": changes}
        )
        own = ",".join(f"{k}={v}" for k, v in sorted(doc["operator_labels"].items()))
        _print(doc if as_json else f"{doc['id']}: operator labels {own or 'none'}", as_json)

    @keys.command("rotate")
    @as_json_option
    @connected
    def rotate(as_json: bool) -> None:
        """New manifest key, announced to devices beside the old one and used from now on."""
        doc = Api.connect().call("POST", "/api/v1/keys/rotate")
        if as_json:
            _print(doc, True)
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
            _print(doc, True)
            return
        click.echo(f"trust root {doc['version']}: revoked {', '.join(doc['revoked'])}")

    del push, list_models, validate, stage, create, list_rollouts, status, list_devices, label
    del show_device, rotate, revoke


def _show(doc: dict[str, Any]) -> None:
    click.echo("\n".join(status_lines(doc)))


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
