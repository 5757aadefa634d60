"""The Kubernetes integration's settings and its optional dependency."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from control_plane.k8s.client import InClusterKubeApi
from control_plane.settings import ControlPlaneSettings
from tests.k3s.schema import ROOT


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFLEET_CP_KUBERNETES__ENABLED", "true")
    monkeypatch.setenv("EDGEFLEET_CP_KUBERNETES__AGENT_DAEMONSET", "")
    monkeypatch.setenv("EDGEFLEET_CP_KUBERNETES__STATUS_INTERVAL_S", "5")
    kube = ControlPlaneSettings().kubernetes
    assert kube.enabled and kube.status_interval_s == 5
    assert kube.agent_daemonset is None  # empty: the guard is off
    monkeypatch.delenv("EDGEFLEET_CP_KUBERNETES__ENABLED")
    assert not ControlPlaneSettings().kubernetes.enabled  # off unless asked for


def test_a_bad_value_names_the_field() -> None:
    with pytest.raises(ValidationError, match=r"kubernetes\.status_interval_s"):
        ControlPlaneSettings.model_validate({"kubernetes": {"status_interval_s": 0}})
    with pytest.raises(ValidationError, match=r"kubernetes\.resync_seconds"):
        ControlPlaneSettings.model_validate({"kubernetes": {"resync_seconds": 10}})


def test_the_control_plane_runs_without_the_kubernetes_client() -> None:
    """Nothing imports ``kubernetes`` until the controller starts in a cluster."""
    code = (
        "import sys; sys.modules['kubernetes'] = None\n"
        "import control_plane.main, control_plane.k8s.lifespan, control_plane.k8s.client\n"
        "from control_plane.k8s.client import InClusterKubeApi\n"
        "try:\n    InClusterKubeApi()\nexcept RuntimeError as exc:\n    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'edgefleet[kubernetes]'" in done.stdout


def test_outside_a_pod_the_client_says_what_is_missing() -> None:
    with pytest.raises(RuntimeError, match="needs in-cluster credentials"):
        InClusterKubeApi()
