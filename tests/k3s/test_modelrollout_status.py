"""``.status`` as the controller writes it, through the fake API server (the seam; no API
server runs here), which applies each write as a JSON merge patch and validates the result
against the CRD's schema as the status subresource does."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from typing import Any

from control_plane.db.models import Rollout
from control_plane.k8s import resource
from control_plane.k8s.resource import conditions, rollout_conditions, rollout_status
from tests.k3s.fake_kube import FakeKubeApi

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
OBJ: dict[str, Any] = {
    "apiVersion": "edgefleet.io/v1alpha1",
    "kind": "ModelRollout",
    "metadata": {"name": "mlp-v2", "namespace": "edgefleet"},
    "spec": {"model": "mlp", "version": 2},
}


def rollout(state: str, reason: str = "", report: dict[str, Any] | None = None) -> Rollout:
    row = Rollout(
        id=7,
        model="mlp",
        version=2,
        sequence=3,
        waves=["1", "100%"],
        state=state,
        current_wave=0,
        reason=reason,
        gate_report={"0": report} if report else {},
    )
    row.devices = []
    return row


def write(kube: FakeKubeApi, row: Rollout) -> dict[str, Any]:
    """One status write of the controller (sync_status) for ``row``."""
    current = kube.get("mlp-v2").get("status") or {}
    status = rollout_status(row, 1)
    status["conditions"] = conditions(
        current.get("conditions") or [], rollout_conditions(status, row), 1, NOW
    )
    stored = asyncio.run(kube.patch_rollout_status("edgefleet", "mlp-v2", status))
    return dict(stored["status"])


def test_a_device_reason_longer_than_the_crd_allows_is_clipped_fake_k8s_api() -> None:
    """A rollback's reason quotes what a device reported (a self-test's output, as long as an
    MQTT message may be). Past the CRD's 32,768 characters for a condition message the API
    server refuses the write, and every later one: .status would freeze."""
    kube = FakeKubeApi()
    kube.apply(copy.deepcopy(OBJ))
    reason = "self-test failed on dev-a: self_test_failed: " + "output mismatch " * 2500
    status = write(kube, rollout("rolled_back", reason))
    assert status["phase"] == "RolledBack"
    texts = [status["message"], status["rollback"]["reason"]]
    quoting = ("Progressing", "Succeeded", "RolledBack")  # the conditions that quote it
    texts += [c["message"] for c in status["conditions"] if c["type"] in quoting]
    for text in texts:
        assert len(text) <= 1024 and text.startswith("self-test failed on dev-a")
        assert text.endswith("[truncated]")
    short = write(kube, rollout("rolled_back", "error rate 6.3% over 410 requests"))
    assert short["message"] == "error rate 6.3% over 410 requests"


def test_the_gate_report_is_the_last_evaluation_only_fake_k8s_api() -> None:
    """Keys the new report lacks are removed, not kept from the one before; and writing the
    same report again changes nothing (the controller writes only what changed)."""
    kube = FakeKubeApi()
    kube.apply(copy.deepcopy(OBJ))
    judged = {"requests": 410, "errors": 1, "p99_ms": 12.0, "error_rate": 0.0024, "p99_ratio": 1.1}
    write(kube, rollout("running", report=judged))
    note = "fewer than 20 requests: error rate and latency not judged yet"
    later = rollout("running", report={"requests": 5, "errors": 0, "p99_ms": None, "note": note})
    stored = write(kube, later)
    assert stored["gateReport"] == {"wave": 0, "requests": 5, "errors": 0, "note": note}
    assert resource.merged(stored, rollout_status(later, 1)) == stored
