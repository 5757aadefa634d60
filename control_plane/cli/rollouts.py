"""``edgefleet rollouts``: staged rollouts, for operators (through the API)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from control_plane.cli.api_client import Api, connected
from control_plane.cli.io import json_document_option, key_values, print_doc
from control_plane.db.states import FINISHED
from control_plane.status_view import status_lines, subject_words


@click.group("rollouts")
def rollouts() -> None:
    """Staged rollouts."""


@click.command("create")
@click.option("--model", help="The model to roll out (with --version).")
@click.option("--version", type=int, help="The model's version.")
@click.option(
    "--agent",
    "agent_version",
    help="Roll out this agent release (edgefleet agents push) instead of a model: each "
    "device's launcher puts it on trial; a wave passes when its devices committed it.",
)
@click.option("--selector", multiple=True, help="label=value (repeatable)")
@click.option("--profile", "profiles", multiple=True)
@click.option("--waves", default="1,10%,50%,100%", show_default=True)
@click.option("--bake-time", type=float, default=60.0, show_default=True, help="seconds per wave")
@click.option("--device-timeout", type=float, default=600.0, show_default=True)
@click.option("--max-error-rate", type=float, default=0.01, show_default=True)
@click.option("--max-p99-ratio", type=float, default=2.0, show_default=True)
@click.option("--min-requests", type=int, default=20, show_default=True)
@click.option(
    "--max-ttft-p99-ms",
    type=click.FloatRange(min=0, min_open=True),
    help="Generative models: roll back when the p99 time to first token on the waves' "
    "devices passes this many ms. Off by default.",
)
@click.option(
    "--max-inter-token-p99-ms",
    type=click.FloatRange(min=0, min_open=True),
    help="Generative models: roll back when the p99 time between tokens passes this many "
    "ms. Off by default.",
)
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
    "--max-accuracy-drop",
    type=click.FloatRange(min=0, max=1, min_open=True),
    help="Pause (not roll back) when the version's live accuracy, from the outcomes apps "
    "post, falls more than this share below the version it replaces (0.05: five points). "
    "Off by default.",
)
@click.option(
    "--min-outcomes",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Outcomes each version needs before --max-accuracy-drop judges.",
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
    model: str | None,
    version: int | None,
    agent_version: str | None,
    selector: tuple[str, ...],
    profiles: tuple[str, ...],
    waves: str,
    bake_time: float,
    device_timeout: float,
    max_error_rate: float,
    max_p99_ratio: float,
    min_requests: int,
    max_ttft_p99_ms: float | None,
    max_inter_token_p99_ms: float | None,
    max_rejections: int,
    allow_unjudged: bool,
    max_drift: float | None,
    max_accuracy_drop: float | None,
    min_outcomes: int,
    shadow_share: float | None,
    min_agreement: float,
    shadow_min_requests: int,
    shadow_timeout: float,
    as_json: bool,
) -> None:
    """Start a staged rollout of a model version (--model, --version) or of an agent release
    (--agent)."""
    # what is missing, or given with --agent, the control plane names (a 400)
    subject = {"model": model, "version": version, "agent_version": agent_version}
    spec: dict[str, Any] = {
        **{k: v for k, v in subject.items() if v is not None},
        "selector": key_values(selector, "--selector", "label=value"),
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
            "max_accuracy_drop": max_accuracy_drop,
            "min_outcomes": min_outcomes,
            "max_ttft_p99_ms": max_ttft_p99_ms,
            "max_inter_token_p99_ms": max_inter_token_p99_ms,
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
        print_doc(doc, True)
        return
    click.echo(
        f"rollout {doc['id']}: {doc['state']}, "
        f"{sum(w['devices'] for w in doc['waves'])} devices "
        f"in {len(doc['waves'])} waves"
    )


@click.command("list")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option(
    "--before",
    type=click.IntRange(1, 2**31 - 1),
    help="Only rollouts older than this id (the last one of the previous page).",
)
@json_document_option
@connected
def list_rollouts(limit: int, before: int | None, as_json: bool) -> None:
    """Rollouts, newest first."""
    params = {"limit": limit, **({"before": before} if before else {})}
    doc = Api.connect().call("GET", "/api/v1/rollouts", params=params)
    if as_json:
        print_doc(doc, True)
        return
    for r in doc:
        click.echo(
            f"rollout {r['id']}: {subject_words(r)} {r['state']}"
            + (f" ({r['reason']})" if r["reason"] else "")
            + f", {sum(w['devices'] for w in r['waves'])} devices, created {r['created_at']}"
        )


@click.command("status")
@click.argument("rollout_id", type=int)
@click.option("--watch", is_flag=True, help="Follow it, redrawn every second, until it ends.")
@json_document_option
@connected
def status(rollout_id: int, watch: bool, as_json: bool) -> None:
    """Progress of a rollout: per wave, each device's phase, the bake's countdown and the
    gates' verdict."""
    api = Api.connect()
    doc = api.call("GET", f"/api/v1/rollouts/{rollout_id}")
    if as_json:
        print_doc(doc, True)
        return
    if not watch:
        _show(doc)
        return
    if sys.stdout.isatty():
        doc = _redrawn(api, doc)
    else:  # a pipe or a file: each new picture once, as lines
        shown = status_lines(doc)
        click.echo("\n".join(shown))
        while doc["state"] not in FINISHED:
            time.sleep(1)
            doc = api.call("GET", f"/api/v1/rollouts/{rollout_id}")
            if (lines := status_lines(doc)) != shown:
                click.echo("\n".join(lines))
                shown = lines
    click.echo(
        f"rollout {rollout_id}: {doc['state']}" + (f": {doc['reason']}" if doc["reason"] else "")
    )


def _redrawn(api: Api, doc: dict[str, Any]) -> dict[str, Any]:
    """Redraw the rollout in place every second until it ends; its last document."""
    from rich.live import Live
    from rich.text import Text

    with Live(Text("\n".join(status_lines(doc))), auto_refresh=False) as live:
        while doc["state"] not in FINISHED:
            time.sleep(1)
            doc = api.call("GET", f"/api/v1/rollouts/{doc['id']}")
            live.update(Text("\n".join(status_lines(doc))), refresh=True)
    return doc


def _show(doc: dict[str, Any]) -> None:
    click.echo("\n".join(status_lines(doc)))


HELP = {
    "abort": " and roll back every device it touched.",
    "cancel": (
        ": devices that switched keep the new version; switches scheduled for a maintenance "
        "window are withdrawn (those devices never switch)."
    ),
}


def _action(action: str) -> click.Command:
    """``rollouts ACTION ROLLOUT_ID``: pause, resume, abort or cancel, each one POST."""

    @click.command(
        action,
        help=f"{action.capitalize()} a rollout" + HELP.get(action, "."),
    )
    @click.argument("rollout_id", type=int)
    @json_document_option
    @connected
    def act(rollout_id: int, as_json: bool) -> None:
        doc = Api.connect().call("POST", f"/api/v1/rollouts/{rollout_id}/{action}")
        line = f"rollout {rollout_id}: {doc['state']}"
        if doc.get("cancelled"):  # what each device keeps, and the switches withdrawn
            line += f": {doc['cancelled']['summary']}"
        print_doc(doc if as_json else line, as_json)

    return act


rollouts.add_command(create)
rollouts.add_command(list_rollouts)
rollouts.add_command(status)
rollouts.add_command(_action("pause"))
rollouts.add_command(_action("resume"))
rollouts.add_command(_action("abort"))
rollouts.add_command(_action("cancel"))
