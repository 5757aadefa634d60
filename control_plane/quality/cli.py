"""``edgefleet models optimize``, and how optimised variants are printed by ``models push`` and
``models list`` (control_plane/registry/cli.py)."""

from __future__ import annotations

import json
from typing import Any

import click

from control_plane.api_client import Api, connected

max_drop_option = click.option(
    "--max-accuracy-drop",
    type=click.FloatRange(0, 1),
    default=0.01,
    show_default=True,
    help="Refuse a variant whose accuracy on the reference set is more than this below FP32's "
    "(a fraction: 0.01 is one point); without labels, whose top-1 agreement is below 1 - this.",
)


def register_quality_commands(models: click.Group) -> None:
    @models.command("optimize")
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

    @models.command("drift")
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
