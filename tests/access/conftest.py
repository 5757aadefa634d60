"""Access and bad-input tests reuse the fleet fixtures (a private Mosquitto, an artifact server,
the test-side fleet, agents with the fleet client on) and the control plane's (SQLite and
PostgreSQL)."""

from tests.agent.fleet.conftest import artifacts, broker, fleet, fleet_agent
from tests.control_plane.conftest import db_url, start_agent, start_control_plane

__all__ = [
    "artifacts",
    "broker",
    "db_url",
    "fleet",
    "fleet_agent",
    "start_agent",
    "start_control_plane",
]
