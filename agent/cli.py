"""The agent's commands under ``edgefleet`` (the root is :mod:`common.cli`): hardware, the
example models and their self-test, and the agent itself."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import click

from agent.plans import plan_repository
from common.cli import settings_failure, subgroup
from runtimes.errors import RuntimeFailure
from runtimes.hardware.context import HardwareContext


def _context(root: Path, profiles: Path | None, profile: str) -> HardwareContext:
    try:
        return HardwareContext.detect(root=root, profiles_dir=profiles, profile=profile)
    except RuntimeFailure as exc:
        raise click.ClickException(str(exc)) from exc


def register_hardware(group: click.Group) -> None:
    @group.command()
    @click.argument(
        "model_repository",
        required=False,
        type=click.Path(exists=True, file_okay=False, path_type=Path),
    )
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
    @click.option(
        "--profile", default="auto", show_default=True, help="Profile name, or auto to detect."
    )
    @click.option(
        "--profiles-dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="Directory of hardware profile TOML files.",
    )
    @click.option(
        "--root",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=Path("/"),
        show_default=True,
        help="Root of /proc, /sys, /dev, /etc.",
    )
    def hardware(
        model_repository: Path | None,
        as_json: bool,
        profile: str,
        profiles_dir: Path | None,
        root: Path,
    ) -> None:
        """Show the detected hardware profile, runtimes and devices, and for a model
        repository where each model would run and why the other candidates were skipped."""
        ctx = _context(root, profiles_dir, profile)
        report = ctx.describe()
        plans = plan_repository(model_repository, ctx) if model_repository else []
        report["models"] = [p.to_dict() for p in plans]
        if as_json:
            click.echo(json.dumps(report, indent=2))
            return
        _print_report(report)

    del hardware


def _print_report(report: dict) -> None:  # type: ignore[type-arg]
    m = report["machine"]
    how = "named with --profile" if report["profile_forced"] else "detected"
    click.echo(f"profile:  {report['profile']} ({how}): {report['profile_description']}")
    click.echo(
        f"machine:  {m['architecture']}, {m['cpu_model']}, {m['cpu_count']} CPUs, "
        f"{(m['memory_total_bytes'] or 0) / 2**30:.1f} GiB"
        + (f", device tree {m['device_tree_model']!r}" if m["device_tree_model"] else "")
    )
    if m["memory_limit_bytes"] or m["cpu_quota"]:
        memory = m["memory_limit_bytes"]
        click.echo(
            "cgroup:   "
            + (f"memory limit {memory / 2**30:.2f} GiB" if memory else "no memory limit")
            + (f", CPU quota {m['cpu_quota']:g}" if m["cpu_quota"] else ", no CPU quota")
            + f" ({m['usable_cpus']} CPUs used)"
        )
    budget = report["memory_budget_bytes"]
    click.echo(f"budget:   {budget / 2**30:.1f} GiB for models" if budget else "budget:   none")
    accel = report["accelerators"]
    click.echo("devices:  CPU" + "".join(f", {k} ({', '.join(v)})" for k, v in accel.items()))
    click.echo("runtimes:")
    for name, info in report["runtimes"].items():
        state = (
            f"{info['version']}: {', '.join(info['devices'])}"
            if info["installed"]
            else info["missing_reason"]
        )
        click.echo(f"  {name:<12} {state}")
    for p in report["profiles"]:
        if not p["matched"]:
            continue
        click.echo(f"matches:  {p['name']} (priority {p['priority']})")
    for model in report["models"]:
        click.echo(f"model {model['model']} v{model['version']}:")
        for s in model["skipped"]:
            click.echo(f"  skipped {s['candidate']}: {s['reason']}")
        if model["error"]:
            click.echo(f"  error: {model['error']}")
        else:
            pl = model["placement"]
            via = f" via {', '.join(pl['providers'])}" if pl["providers"] else ""
            pinned = " (pinned in config.toml)" if model["pinned"] else ""
            click.echo(f"  -> {pl['runtime']} {pl['device']}{via}{pinned} [{model['format']}]")


def register_models(group: click.Group) -> None:
    models = subgroup(group, "models", "Model repositories and the model registry.")

    @models.command("example")
    @click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
    @click.option("--force", is_flag=True, help="Replace models that already exist.")
    @click.option("--only", multiple=True, help="Write only these models (repeatable).")
    @click.option(
        "--lm-size",
        type=click.Choice(["tiny", "bench"]),
        default="tiny",
        show_default=True,
        help="tiny-lm's size: bench is ~26 M parameters (100 MB), for benchmarks.",
    )
    def example(directory: Path, force: bool, only: tuple[str, ...], lm_size: str) -> None:
        """Write the example model repository (mlp, cnn, cnn_ir, mlp_tflite, classifier,
        digits, tiny-lm) to DIRECTORY."""
        from runtimes.examples import EXAMPLE_MODELS, write_example_repository
        from runtimes.examples.tiny_lm import LmSize

        try:
            write_example_repository(
                directory,
                models=only or EXAMPLE_MODELS,
                overwrite=force,
                lm_size=LmSize(lm_size),
                log=click.echo,
            )
        except FileExistsError as exc:
            raise click.ClickException(str(exc)) from exc
        except OSError as exc:  # not writable, or below a file
            raise click.ClickException(f"{exc.filename}: {exc.strerror}") from exc
        except ValueError as exc:  # an unknown --only
            raise click.ClickException(str(exc)) from exc

    @models.command("selftest")
    @click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
    @click.option(
        "--cache-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Compiled-model cache (default: none).",
    )
    def selftest(directory: Path, cache_dir: Path | None) -> None:
        """Place every model of DIRECTORY on this machine's best runtime and device, load it
        and check it against its golden sample; exit 1 if any model fails."""
        from agent.selftest import self_test

        raise SystemExit(self_test(directory, cache_dir, click.echo))

    del example, selftest


def _grpc_flags(port: int | None, uds: Path | None, off: bool) -> dict[str, object] | None:
    """The ``[grpc]`` settings the flags give, merged over the file's and the environment's."""
    if off:
        if port is not None or uds is not None:
            raise click.UsageError("--no-grpc with --grpc-port or --grpc-uds: choose one")
        return {"enabled": False}
    if port is None and uds is None:
        return None
    flags: dict[str, object] = {"enabled": True}
    if port is not None:
        flags["port"] = port
    if uds is not None:
        flags["uds"] = uds
    return flags


def register_agent(group: click.Group) -> None:
    from agent.launcher.cli import register_launcher

    # the launcher is the agent's part too (the .deb's unit runs it); registered here, with
    # the agent's entry point, so an installed dist-info lists no new entry point
    register_launcher(group)
    bundle = subgroup(group, "bundle", BUNDLE_HELP)
    register_bundle_install(bundle)

    # a group that serves when no subcommand follows: ``edgefleet agent --port 8000`` serves,
    # ``edgefleet agent install BUNDLE`` is ``edgefleet bundle install BUNDLE``
    @group.group(invoke_without_command=True)
    @click.option(
        "--model-repository",
        type=click.Path(file_okay=False, path_type=Path),
        help="Model repository directory.",
    )
    @click.option("--host", help="Address to listen on (default 127.0.0.1).")
    @click.option("--port", type=int, help="TCP port (default 8000; 0 picks a free one).")
    @click.option(
        "--uds", type=click.Path(dir_okay=False, path_type=Path), help="Listen on a Unix socket."
    )
    @click.option(
        "--grpc-port",
        type=click.IntRange(0, 65535),
        help="Serve KServe V2 / Triton gRPC on this TCP port too (8001 is Triton's; 0 picks one).",
    )
    @click.option(
        "--grpc-uds",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Serve gRPC on this Unix socket (clients: unix:PATH); its directory is made.",
    )
    @click.option("--no-grpc", is_flag=True, help="No gRPC, whatever the settings say.")
    @click.option("--profile", help="Hardware profile name, or auto (default).")
    @click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="TOML settings file (EDGEFLEET_AGENT_* variables and flags override it).",
    )
    @click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
    @click.pass_context
    def agent(
        ctx: click.Context,
        model_repository: Path | None,
        host: str | None,
        port: int | None,
        uds: Path | None,
        grpc_port: int | None,
        grpc_uds: Path | None,
        no_grpc: bool,
        profile: str | None,
        config_file: Path | None,
        log_level: str | None,
    ) -> None:
        """Serve the models of a repository on a local REST endpoint (KServe V2, TF Serving;
        OpenAI-compatible for generative models), and over gRPC with --grpc-port or
        --grpc-uds."""
        if ctx.invoked_subcommand is not None:
            return
        from pydantic import ValidationError

        from agent.main import run
        from agent.settings import SettingsError, load_settings

        try:
            settings = load_settings(
                config_file,
                model_repository=model_repository,
                host=host,
                port=port,
                uds=uds,
                grpc=_grpc_flags(grpc_port, grpc_uds, no_grpc),
                profile=profile,
                log_level=log_level,
            )
        except (ValidationError, FileNotFoundError, tomllib.TOMLDecodeError) as exc:
            raise settings_failure(exc, config_file) from exc
        try:
            run(settings)
        except SettingsError as exc:
            raise click.ClickException(str(exc)) from exc
        except RuntimeFailure as exc:
            raise click.ClickException(str(exc)) from exc
        except OSError as exc:
            raise click.ClickException(f"cannot listen: {exc}") from exc

    agent.add_command(bundle.commands["install"])


BUNDLE_HELP = "Offline bundles: signed updates carried to a device."


def register_bundle_install(bundle: click.Group) -> None:
    @bundle.command("install")
    @click.argument("bundle_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="The agent's TOML settings file: where its fleet state_dir is.",
    )
    @click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="The agent's fleet state directory (default: from the settings).",
    )
    @click.option(
        "--wait-s",
        type=click.FloatRange(min=0),
        default=120.0,
        show_default=True,
        help="How long to wait for the agent to verify it and commit or roll back.",
    )
    def install(
        bundle_file: Path, config_file: Path | None, state_dir: Path | None, wait_s: float
    ) -> None:
        """Hand BUNDLE_FILE to this device's agent, which verifies it as an update from the
        fleet (trust root, anti-rollback, expiry) and applies it with the same trial and
        rollback; print what it did. The agent need not be running: it takes the bundle
        when it starts."""
        from pydantic import ValidationError

        from agent.bundle_install import hand_in, looks_like_a_bundle, outcome, verdicts
        from agent.settings import load_settings
        from common.protocol.errors import ProtocolError

        try:
            looks_like_a_bundle(bundle_file)
        except ProtocolError as exc:
            raise click.ClickException(f"{bundle_file}: {exc.code.value}: {exc.message}") from exc

        if state_dir is None:
            try:
                state_dir = load_settings(config_file).fleet.state_dir
            except (ValidationError, FileNotFoundError, tomllib.TOMLDecodeError) as exc:
                raise settings_failure(exc, config_file) from exc
        try:
            handed = hand_in(bundle_file, state_dir)
        except OSError as exc:
            where = exc.filename or state_dir
            raise click.ClickException(f"{where}: {exc.strerror or exc}") from exc
        results = verdicts(handed, wait_s)
        if results is None:
            click.echo(f"queued as {handed}: the agent takes it when it runs")
            return
        ok = True
        for line, good in outcome(results, state_dir, wait_s):
            click.echo(line)
            ok = ok and good
        if not ok:
            raise SystemExit(1)
