"""The ModelRollout CRD: a structural schema the API server accepts, the examples validate
against it, and objects it must refuse fail it."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
import yaml

from control_plane.errors import Invalid
from control_plane.k8s.resource import rollout_spec
from tests.k3s.schema import CRD, K3S, crd_schema, modelrollout_validator

EXAMPLES = sorted((K3S / "examples").glob("modelrollout-*.yaml"))
VALID: dict[str, Any] = {
    "apiVersion": "edgefleet.io/v1alpha1",
    "kind": "ModelRollout",
    "metadata": {"name": "mlp-v2", "namespace": "edgefleet"},
    "spec": {"model": "mlp", "version": 2},
}


def _nodes(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for key in ("properties",):
            for name, child in node.get(key, {}).items():
                out += _nodes(child, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                out += _nodes(node[key], f"{path}[{key}]")
    return out


def test_the_crd_schema_is_structural() -> None:
    """What the API server demands of a v1 CRD schema (a structural schema)."""
    crd = yaml.safe_load(CRD.read_text())
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    (version,) = crd["spec"]["versions"]
    assert version["served"] and version["storage"] and version["subresources"] == {"status": {}}
    for path, node in _nodes(crd_schema()):
        if node.get("x-kubernetes-int-or-string"):
            assert [s["type"] for s in node["anyOf"]] == ["integer", "string"], path
            continue
        assert "type" in node, f"{path}: every node has a type"
        assert not ("properties" in node and "additionalProperties" in node), path
    status = crd_schema()["properties"]["status"]["properties"]
    assert {"phase", "waves", "counts", "conditions", "rollback"} <= status.keys()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_crd_schema(example: Any) -> None:
    obj = yaml.safe_load(example.read_text())
    modelrollout_validator().validate(obj)
    spec = rollout_spec(obj)  # and the control plane takes the spec as it is
    assert spec.model == obj["spec"]["model"] and spec.version == obj["spec"]["version"]
    assert spec.selector == obj["spec"]["selector"]["matchLabels"]


def test_the_detector_example_maps_onto_the_rollout_spec() -> None:
    obj = yaml.safe_load((K3S / "examples/modelrollout-detector.yaml").read_text())
    spec = rollout_spec(obj)
    assert spec.waves == ["1", "25%", "100%"]
    assert spec.bake_time_s == 600 and spec.device_timeout_s == 900
    assert spec.gates.max_p99_ratio == 1.5 and spec.gates.min_requests == 200


def _with(path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(VALID)
    *parents, leaf = path.split(".")
    node = obj
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.model", "../etc"),
        ("spec.model", ""),
        ("spec.version", 0),
        ("spec.version", "2"),
        ("spec.waves", []),
        ("spec.waves", ["0%"]),
        ("spec.waves", ["150%"]),
        ("spec.waves", [0]),
        ("spec.waves", ["ten"]),
        ("spec.bakeTimeSeconds", -1),
        ("spec.deviceTimeoutSeconds", 0),
        ("spec.gates.maxErrorRate", 1.5),
        ("spec.gates.minRequests", -1),
        ("spec.gates.maxP99Ratio", 0),
        ("spec.gates.selfTest", "yes"),
        ("spec.gates.maxErrorRates", 0.1),
        ("spec.selector.matchLabels", {"site": 3}),
        ("spec.selector.labels", {"site": "a"}),
        ("spec.target", "all"),
        ("status.phase", "Done"),
        ("status.conditions", [{"type": "Ready", "status": "True"}]),
    ],
)
def test_objects_the_api_server_must_refuse_fail_the_schema(path: str, value: Any) -> None:
    modelrollout_validator().validate(VALID)  # the object is fine without the change
    with pytest.raises(jsonschema.ValidationError):
        modelrollout_validator().validate(_with(path, value))


def test_a_rollout_without_model_or_version_fails_the_schema() -> None:
    for field in ("model", "version"):
        obj = copy.deepcopy(VALID)
        del obj["spec"][field]
        with pytest.raises(jsonschema.ValidationError, match=f"'{field}' is a required property"):
            modelrollout_validator().validate(obj)


def test_a_spec_the_engine_refuses_names_the_field() -> None:
    """What the schema cannot see, the controller reports against the object's field name."""
    with pytest.raises(Invalid, match=r"^spec\.waves: .*out of range"):
        rollout_spec(_with("spec.waves", ["101%"]))
    with pytest.raises(Invalid, match=r"^spec\.gates\.maxErrorRate: "):
        rollout_spec(_with("spec.gates.maxErrorRate", 2))
