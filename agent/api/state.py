"""What the HTTP routes reach through ``app.state.api``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.inference.manager import ModelManager
from agent.inference.service import InferenceService
from agent.metrics import AgentMetrics
from agent.settings import AgentSettings

if TYPE_CHECKING:  # the fleet client (MQTT, signatures) is imported only when it is enabled
    from agent.fleet.client import FleetClient


@dataclass
class ApiState:
    service: InferenceService
    manager: ModelManager
    metrics: AgentMetrics
    settings: AgentSettings
    fleet: FleetClient | None = None
    loaded: bool = False
    """The start-up load of the repository has finished."""

    def ready(self) -> bool:
        if not (self.loaded and self.service.accepting):
            return False
        if self.settings.strict_readiness:
            return self.manager.ready()
        return any(e.served for e in self.manager.models.values())
