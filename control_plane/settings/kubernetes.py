"""Settings of the Kubernetes integration, nested in the control plane's as ``kubernetes``
(``EDGEFLEET_CP_KUBERNETES__*``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class KubernetesSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = False
    """Watch ModelRollout objects and guard the agent DaemonSet, with the pod's in-cluster
    credentials (needs the ``kubernetes`` extra)."""
    namespace: str | None = None
    """Namespace to watch; None is the pod's own (from its service account)."""
    resync_s: float = Field(default=300.0, gt=0)
    """Length of one watch; every object is listed and reconciled again after it."""
    status_interval_s: float = Field(default=2.0, gt=0)
    """How often the progress of active rollouts is written into their ``.status``."""
    retry_max_s: float = Field(default=30.0, gt=0)
    """Longest wait between retries while the API server is unreachable."""
    agent_daemonset: str | None = "edgefleet-agent"
    """The agent DaemonSet to roll back when an upgrade fails its health gates; None or ""
    (an environment variable cannot say None) turns the guard off."""
    agent_check_interval_s: float = Field(default=15.0, gt=0)
    """How often the agent DaemonSet's upgrade is checked."""
    agent_ready_deadline_s: float = Field(default=600.0, gt=0)
    """An upgraded agent pod not ready this long after it was created fails the upgrade."""
    agent_max_restarts: int = Field(default=3, ge=0)
    """An upgraded agent pod whose container restarted more often fails the upgrade."""
    agent_upgrade_window_s: float = Field(default=3600.0, gt=0)
    """After every pod runs the new revision, how long its failures still count against the
    upgrade (later failures are the node's problem, not the upgrade's)."""

    @field_validator("agent_daemonset")
    @classmethod
    def _empty_is_off(cls, value: str | None) -> str | None:
        return value or None
