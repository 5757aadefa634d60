"""``edgefleet devices logs`` and ``edgefleet devices support-bundle``: ask a device for its
recent log lines or a support bundle, wait for the upload, and write it out (operator;
docs/operations.md, "Seeing a device's logs")."""

from __future__ import annotations

import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from control_plane.cli.api_client import Api, connected

_AGO = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
POLL_S = 0.5


def _time(value: str | None, option: str) -> str | None:
    """``15m``, ``2h``, ``1d`` ago, or an ISO 8601 time with its zone, as ISO 8601."""
    if value is None:
        return None
    if m := _AGO.match(value):
        ago = timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
        return (datetime.now(UTC) - ago).isoformat()
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        at = None
    if at is None or at.utcoffset() is None:
        raise click.BadParameter(
            "give 15m, 2h, 1d or an ISO 8601 time with its zone", param_hint=option
        )
    return at.isoformat()


def _progress(doc: dict[str, Any]) -> str:
    state = doc["state"]
    if state == "uploading":
        return f"uploading {doc['received_bytes']}/{doc['total_bytes']} bytes"
    if state == "failed":
        return f"failed: {doc['error']}"
    return str(state)


def _wait_and_write(
    api: Api, device_id: str, doc: dict[str, Any], out: Path | None, timeout_s: float
) -> None:
    base = f"/api/v1/devices/{quote(device_id, safe='')}/diagnostics/{doc['id']}"
    deadline = time.monotonic() + timeout_s
    shown = ""
    while doc["state"] not in ("complete", "failed"):
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"request {doc['id']} is still {_progress(doc)} after {timeout_s:g} s (an "
                f"offline device answers on its return): fetch it later with "
                f"--request {doc['id']}"
            )
        time.sleep(POLL_S)
        doc = api.call("GET", base)
        if (line := _progress(doc)) != shown:
            click.echo(f"{doc['id']}: {line}", err=True)
            shown = line
    if doc["state"] == "failed":
        raise click.ClickException(f"request {doc['id']} failed: {doc['error']}")
    data = api.content(f"{base}/data")
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        out.write_bytes(data)
        click.echo(f"wrote {len(data)} bytes to {out}", err=True)


WAIT_S = click.option(
    "--timeout-s",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="how long --wait waits for the upload",
)


@click.command("logs")
@click.argument("device_id")
@click.option("--since", help="oldest line: 15m, 2h, 1d ago or an ISO 8601 time")
@click.option("--until", help="newest line: as --since")
@click.option(
    "--level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
    help="least severe level sent",
)
@click.option(
    "--max-bytes", type=click.IntRange(min=1), help="the newest lines that fit (default 256 KiB)"
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="wait for the upload and write it (else print the request)",
)
@click.option("--request", "request_id", help="fetch an earlier request's answer instead")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="write the JSON lines here (default: stdout)",
)
@WAIT_S
@connected
def logs(
    device_id: str,
    since: str | None,
    until: str | None,
    level: str | None,
    max_bytes: int | None,
    wait: bool,
    request_id: str | None,
    output: Path | None,
    timeout_s: float,
) -> None:
    """Ask DEVICE_ID for its recent log lines (JSON lines, newest last) through a signed
    request, and write them once uploaded."""
    api = Api.connect()
    device = quote(device_id, safe="")
    if request_id is not None:
        doc = api.call("GET", f"/api/v1/devices/{device}/diagnostics/{quote(request_id, safe='')}")
    else:
        body: dict[str, Any] = {
            k: v
            for k, v in {
                "since": _time(since, "--since"),
                "until": _time(until, "--until"),
                "level": level,
                "max_bytes": max_bytes,
            }.items()
            if v is not None
        }
        doc = api.call("POST", f"/api/v1/devices/{device}/logs", json=body)
        if not wait:
            click.echo(f"{doc['id']}: {_progress(doc)}")
            return
    _wait_and_write(api, device_id, doc, output, timeout_s)


@click.command("support-bundle")
@click.argument("device_id")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="write the bundle (JSON) here",
)
@click.option("--max-bytes", type=click.IntRange(min=1024), help="size cap (default 4 MiB)")
@WAIT_S
@connected
def support_bundle(device_id: str, output: Path, max_bytes: int | None, timeout_s: float) -> None:
    """Ask DEVICE_ID for a support bundle: its settings (secrets redacted), the versions it
    serves, recent update events, its metrics, its outbox's state and its newest log lines."""
    api = Api.connect()
    body = {"max_bytes": max_bytes} if max_bytes else {}
    doc = api.call("POST", f"/api/v1/devices/{quote(device_id, safe='')}/support-bundle", json=body)
    _wait_and_write(api, device_id, doc, output, timeout_s)
