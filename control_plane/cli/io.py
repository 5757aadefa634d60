"""What the operator commands read from their arguments and print: ``key=value`` pairs, TOML
files, the control plane's JSON documents; the ``--json`` options that ask for them."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import click


def print_doc(doc: Any, as_json: bool) -> None:
    click.echo(json.dumps(doc, indent=2) if as_json else doc)


def key_values(values: tuple[str, ...], param: str, expected: str) -> dict[str, str]:
    """``key=value`` arguments as a dict (the value may be empty)."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected {expected}, got {item!r}", param_hint=param)
        out[key] = value
    return out


def read_toml(path: Path, param: str) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint=param) from exc
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror or exc}", param_hint=param) from exc


def label_pairs(values: tuple[str, ...], param: str) -> dict[str, str]:
    """``label=value`` options as a dict (a value may be empty): the selectors and labels of
    deployments, windows and claims (unlike :func:`key_values`, a key of spaces passes)."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected label=value, got {item!r}", param_hint=param)
        out[key] = value
    return out


json_document_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the control plane's JSON document."
)
"""``--json`` of the devices, keys, models and rollouts commands."""
json_option = click.option("--json", "as_json", is_flag=True, help="Print the JSON.")
"""``--json`` of the claims, enrolments, deployments and windows commands."""
