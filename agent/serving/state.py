"""What every front end reaches (REST routes through ``app.state.api``, the gRPC servicer by
its constructor), and the server's readiness."""

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
    from agent.generative.models import GenerativeModels
    from agent.tracing import Tracing


@dataclass
class ServingState:
    service: InferenceService
    manager: ModelManager
    metrics: AgentMetrics
    settings: AgentSettings
    fleet: FleetClient | None = None
    shared_memory: SharedMemoryRegistry | None = None
    """Registered system shared memory regions (HTTP and gRPC share them)."""
    generative: GenerativeModels | None = None
    """Generative models and their token loops; None when the repository holds none (the
    generative code is not even imported then)."""
    tracing: Tracing | None = None
    """OpenTelemetry request spans, where ``[tracing] enabled``."""
    loaded: bool = False
    """The start-up load of the repository has finished."""

    @property
    def serves_generative(self) -> bool:
        """Whether the generative front ends are mounted: the repository held a generative
        model at start, or the agent follows a fleet, which may deliver one at any time."""
        return self.generative is not None or self.settings.fleet.enabled

    def ready(self) -> bool:
        """The server's readiness (``/v2/health/ready``, gRPC ``ServerReady``, systemd's STATUS
        line).

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
        if self.generative is not None and self.settings.strict_readiness:
            if not self.generative.ready():
                return False
        return self.manager.ready(strict=self.settings.strict_readiness)
