"""What the HTTP routes reach through ``app.state.api``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.inference.manager import ModelManager
from agent.inference.service import InferenceService
from agent.metrics import AgentMetrics
from agent.settings import AgentSettings
from agent.shm.regions import SharedMemoryRegistry

if TYPE_CHECKING:  # the fleet client (MQTT, signatures) is imported only when it is enabled
    from agent.fleet.client import FleetClient


@dataclass
class ApiState:
    service: InferenceService
    manager: ModelManager
    metrics: AgentMetrics
    settings: AgentSettings
    fleet: FleetClient | None = None
    shared_memory: SharedMemoryRegistry | None = None
    """Registered system shared memory regions (HTTP and gRPC share them)."""
    loaded: bool = False
    """The start-up load of the repository has finished."""

    def ready(self) -> bool:
        """The server's readiness (``/v2/health/ready``, systemd's STATUS line).

        Ready once the start-up load has finished, until shutdown begins, while the models
        allow it (:meth:`ModelManager.ready` under ``strict_readiness``): an empty repository
        is ready, as in Triton. An agent that follows a fleet built its fleet client (state and
        trust root read, store recovered) before the start-up load, so from then on it can
        receive its desired state; whether the broker is reachable does not count, because an
        agent serves what it holds without its network.
        """
        if not (self.loaded and self.service.accepting):
            return False
        if self.settings.fleet.enabled and self.fleet is None:
            return False  # wired without the fleet client it was told to follow
        return self.manager.ready(strict=self.settings.strict_readiness)
