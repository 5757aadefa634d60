"""Deployments are tested with devices that join by claim: the enrolment fixtures (a broker
with the dynamic security plugin, a control plane, claimed agents); maintenance windows on the
device's side with the test-side fleet of ``tests/agent/fleet`` (it signs manifests itself)."""

from tests.agent.fleet.conftest import artifacts, broker, fleet, fleet_agent
from tests.control_plane.enrolment.conftest import claimed_agent, cp, dynsec_broker

__all__ = [
    "artifacts",
    "broker",
    "claimed_agent",
    "cp",
    "dynsec_broker",
    "fleet",
    "fleet_agent",
]
