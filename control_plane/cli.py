"""``edgefleet control-plane`` (the service) and the operator commands, which speak to its API
(``EDGEFLEET_URL``, default http://127.0.0.1:8080; ``EDGEFLEET_TOKEN``)."""

from __future__ import annotations

import json
import os
import time
import tomllib
from pathlib import Path
from typing import Any

import click

from control_plane.provisioning.cli import register_fleet
from control_plane.rollouts.states import DEVICE_FINISHED, FINISHED, RolloutState


def _group(root: click.Group, name: str, help_text: str) -> click.Group:
    existing = root.commands.get(name)
    if isinstance(existing, click.Group):
        return existing
    group = click.Group(name, help=help_text)
    root.add_command(group)
    return group


class Api:
    def __init__(self) -> None:
        self.url = os.environ.get("EDGEFLEET_URL", "http://127.0.0.1:8080").rstrip("/")
        token = os.environ.get("EDGEFLEET_TOKEN", "")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        import httpx  # here, not at start-up: every edgefleet command loads this module

        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=600)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise click.ClickException(
                f"cannot reach the control plane at {self.url}: {exc}"
            ) from exc
        if resp.status_code >= 400:
            try:
                message = resp.json().get("error", resp.text)
            except ValueError:
                message = resp.text
            raise click.ClickException(f"{resp.status_code}: {message}")
        return resp.json() if resp.content else None


def _print(doc: Any, as_json: bool) -> None:
    click.echo(json.dumps(doc, indent=2) if as_json else doc)


def register_control_plane(root: click.Group) -> None:
    @root.group("control-plane", invoke_without_command=True)
    @click.option(
        "--db",
        "db_url",
        help="SQLAlchemy URL (sqlite+aiosqlite:///... or postgresql+psycopg://...).",
    )
    @click.option("--mqtt", "mqtt_url", help="Broker URL, mqtt://host:port or mqtts://.")
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

        from control_plane.main import run
        from control_plane.settings import load_settings

        try:
            settings = load_settings(config_file, **flags)
        except (ValidationError, FileNotFoundError) as exc:
            raise click.ClickException(f"invalid settings: {exc}") from exc
        run(settings)

    @control_plane.command("token")
    @click.option("--name", required=True)
    @click.option("--role", type=click.Choice(["viewer", "operator", "admin"]), required=True)
    @click.pass_obj
    def token(obj: tuple[Path | None, dict[str, Any]], name: str, role: str) -> None:
        """Create an API token directly in the database (printed once)."""
        import asyncio

        from control_plane.api.auth import Role, create_token
        from control_plane.db.session import make_engine, migrate, session_factory
        from control_plane.settings import load_settings

        settings = load_settings(obj[0], **obj[1])
        migrate(settings.db_url)

        async def make() -> str:
            engine = make_engine(settings.db_url)
            try:
                async with session_factory(engine).begin() as s:
                    return await create_token(s, name, Role[role.upper()])
            finally:
                await engine.dispose()

        click.echo(asyncio.run(make()))

    del control_plane, token
    register_fleet(root)  # local to the control plane's state directory, like `token`


def register_operator_commands(root: click.Group) -> None:
    models = _group(root, "models", "Model repositories and the model registry.")
    rollouts = _group(root, "rollouts", "Staged rollouts.")
    devices = _group(root, "devices", "The device inventory.")
    keys = _group(root, "keys", "Signing keys and the trust root.")

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
    def push(name: str, version: int, variants: tuple[str, ...], config_file: Path | None) -> None:
        """Upload VERSION of NAME. Each VARIANT is a directory with the model file(s), optionally
        DIR@profile1,profile2 to reserve it for hardware profiles. golden.npz and validation.npz
        are taken from the first directory that has them."""
        from runtimes.formats import find_model_file

        api = Api()
        config: dict[str, Any] = tomllib.loads(config_file.read_text()) if config_file else {}
        health = config.pop("health", {})
        specs, dirs = [], []
        for item in variants:
            path, _, profiles = item.partition("@")
            directory = Path(path)
            model_file, fmt = find_model_file(directory)
            files = [model_file] + (
                [model_file.with_suffix(".bin")] if fmt.value == "openvino_ir" else []
            )
            specs.append({"format": fmt.value, "profiles": [p for p in profiles.split(",") if p]})
            dirs.append((directory, files))
        api.call(
            "POST",
            f"/api/v1/models/{name}/versions",
            json={"version": version, "variants": specs, "config": config, "health": health},
        )
        for index, (_, files) in enumerate(dirs):
            for f in files:
                with f.open("rb") as fh:
                    done = api.call(
                        "PUT",
                        f"/api/v1/models/{name}/versions/{version}/variants/{index}/files/{f.name}",
                        content=fh,
                    )
                click.echo(f"uploaded {f} ({done['size']} bytes, sha256 {done['sha256'][:12]})")
        for sample, route in (("golden.npz", "golden"), ("validation.npz", "validation-data")):
            found = next((d / sample for d, _ in dirs if (d / sample).is_file()), None)
            if found:
                with found.open("rb") as fh:
                    api.call("PUT", f"/api/v1/models/{name}/versions/{version}/{route}", content=fh)
                click.echo(f"uploaded {found}")

    @models.command("list")
    @click.option("--json", "as_json", is_flag=True)
    def list_models(as_json: bool) -> None:
        """Models in the registry with their versions and stages."""
        doc = Api().call("GET", "/api/v1/models")
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

    @models.command("validate")
    @click.argument("name")
    @click.argument("version", type=int)
    def validate(name: str, version: int) -> None:
        """Validate a version: loads on its runtimes, agreement, golden, accuracy."""
        report = Api().call("POST", f"/api/v1/models/{name}/versions/{version}/validate")
        for c in report["checks"]:
            click.echo(
                f"{'PASS' if c['passed'] else 'FAIL'}  {c['check']}"
                + (f"  ({c['detail']})" if c["detail"] else "")
            )
        click.echo("passed" if report["passed"] else "FAILED")
        if not report["passed"]:
            raise SystemExit(1)

    @models.command("stage")
    @click.argument("name")
    @click.argument("version", type=int)
    @click.argument("stage", type=click.Choice(["candidate", "production", "retired"]))
    def stage(name: str, version: int, stage: str) -> None:
        """Label a version candidate, production or retired."""
        Api().call("POST", f"/api/v1/models/{name}/versions/{version}/stage", json={"stage": stage})

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
    ) -> None:
        """Start a staged rollout."""
        spec = {
            "model": model,
            "version": version,
            "selector": dict(s.split("=", 1) for s in selector),
            "profiles": list(profiles),
            "waves": waves.split(","),
            "bake_time_s": bake_time,
            "device_timeout_s": device_timeout,
            "gates": {
                "max_error_rate": max_error_rate,
                "max_p99_ratio": max_p99_ratio,
                "min_requests": min_requests,
                "max_rejections": max_rejections,
            },
        }
        doc = Api().call("POST", "/api/v1/rollouts", json=spec)
        click.echo(
            f"rollout {doc['id']}: {doc['state']}, "
            f"{sum(w['devices'] for w in doc['waves'])} devices "
            f"in {len(doc['waves'])} waves"
        )

    @rollouts.command("status")
    @click.argument("rollout_id", type=int)
    @click.option(
        "--watch", is_flag=True, help="Live progress bars per wave until the rollout ends."
    )
    @click.option("--json", "as_json", is_flag=True)
    def status(rollout_id: int, watch: bool, as_json: bool) -> None:
        """Progress of a rollout, per wave."""
        api = Api()
        doc = api.call("GET", f"/api/v1/rollouts/{rollout_id}")
        if as_json:
            _print(doc, True)
            return
        if not watch:
            _show(doc)
            return
        from rich.progress import BarColumn, Progress, TextColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[states]}"),
        ) as progress:
            tasks = [
                progress.add_task(f"wave {w['wave']} ({w['size']})", total=w["devices"], states="")
                for w in doc["waves"]
            ]
            while True:
                for task, w in zip(tasks, doc["waves"], strict=True):
                    done = sum(n for s, n in w["states"].items() if s in DEVICE_FINISHED)
                    progress.update(
                        task,
                        completed=done,
                        states=" ".join(f"{s}={n}" for s, n in sorted(w["states"].items())),
                    )
                if doc["state"] in FINISHED:
                    break
                time.sleep(1)
                doc = api.call("GET", f"/api/v1/rollouts/{rollout_id}")
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
            def act(rollout_id: int) -> None:
                doc = Api().call("POST", f"/api/v1/rollouts/{rollout_id}/{action}")
                click.echo(f"rollout {rollout_id}: {doc['state']}")

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
    @click.option("--json", "as_json", is_flag=True)
    def list_devices(
        label: tuple[str, ...],
        profile: str | None,
        online: bool | None,
        silent: bool,
        as_json: bool,
    ) -> None:
        """Devices, filtered by labels, profile and presence (online, offline, or silent: online
        by its last status, but nothing heard from it for longer than its limit)."""
        params: dict[str, Any] = {"label": list(label)}
        if profile:
            params["profile"] = profile
        if online is not None:
            params["online"] = str(online).lower()
        if silent:
            params["presence"] = "silent"
        doc = Api().call("GET", "/api/v1/devices", params=params)
        if as_json:
            _print(doc, True)
            return
        for d in doc:
            served = ", ".join(f"{m['model']} v{m['version']}" for m in d["models"])
            labels = ",".join(f"{k}={v}" for k, v in sorted(d["labels"].items()))
            click.echo(
                f"{d['id']:<20} {d['presence']:<7} "
                f"{d['hardware_profile'] or '?':<20} "
                f"{labels:<30} {served}"
            )

    @devices.command("label")
    @click.argument("device_id")
    @click.argument("labels", nargs=-1, required=True)
    def label(device_id: str, labels: tuple[str, ...]) -> None:
        """Set operator labels (key=value), or remove one (key=)."""
        changes = {k: (v or None) for k, _, v in (x.partition("=") for x in labels)}
        Api().call("PATCH", f"/api/v1/devices/{device_id}/labels", json={"labels": changes})

    @keys.command("rotate")
    def rotate() -> None:
        """New manifest key, announced to devices beside the old one and used from now on."""
        doc = Api().call("POST", "/api/v1/keys/rotate")
        click.echo(
            f"signing with {doc['signing_key']}; "
            "revoke the old key once the fleet has trust root N+1"
        )

    @keys.command("revoke")
    @click.argument("key_id")
    def revoke(key_id: str) -> None:
        """Revoke a manifest key."""
        doc = Api().call("POST", f"/api/v1/keys/{key_id}/revoke")
        click.echo(f"trust root {doc['version']}: revoked {', '.join(doc['revoked'])}")

    del push, list_models, validate, stage, create, status, list_devices, label, rotate, revoke


def _show(doc: dict[str, Any]) -> None:
    click.echo(
        f"rollout {doc['id']}: {doc['model']} v{doc['version']} {doc['state']}"
        + (f" ({doc['reason']})" if doc["reason"] else "")
    )
    for w in doc["waves"]:
        current = w["wave"] == doc["current_wave"] and doc["state"] == RolloutState.RUNNING
        marker = ">" if current else " "
        states = " ".join(f"{s}={n}" for s, n in sorted(w["states"].items()))
        click.echo(f" {marker} wave {w['wave']} ({w['size']}): {w['devices']} devices  {states}")


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
