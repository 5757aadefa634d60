"""What the rollout engine, the rollback path and trust publication need of the broker: a
:class:`Publisher`, which :class:`control_plane.mqtt.bus.FleetBus` satisfies. A leaf (the wire's
topics only), so that they depend on publishing, not on the bus, its client and the ingest it
feeds; and a fake in a test is any object with these methods."""

from __future__ import annotations

from typing import Any, Protocol

from common.protocol.topics import Topics


class Publisher(Protocol):
    """Queues messages for devices; each is sent once the broker connection allows, in order."""

    @property
    def topics(self) -> Topics:
        """The fleet's topic names (its prefix)."""
        ...

    def publish_desired(self, device_id: str, manifests: list[dict[str, Any]]) -> None:
        """Publish ``device_id``'s desired state (signed manifests), retained."""
        ...

    def publish_retained(self, topic: str, payload: bytes) -> None:
        """Publish ``payload`` on ``topic``, retained: a later one on the topic replaces it."""
        ...

    def publish_command(self, device_id: str, envelope: dict[str, Any]) -> None:
        """Send ``device_id`` a signed command (not retained)."""
        ...
