"""MQTT topics: one subtree per device under a configurable prefix, plus fleet-wide topics.

    <prefix>/devices/<device_id>/status      device -> fleet, retained: birth, or will (offline)
    <prefix>/devices/<device_id>/telemetry   device -> fleet, QoS 1
    <prefix>/devices/<device_id>/events      device -> fleet, QoS 1: update state transitions
    <prefix>/devices/<device_id>/desired     fleet -> device, retained: signed manifests
    <prefix>/devices/<device_id>/commands    fleet -> device, QoS 1: signed commands (rollback)
    <prefix>/devices/<device_id>/acks        fleet -> device, QoS 1: telemetry stored (seqs)
    <prefix>/fleet/trust                     fleet -> all, retained: signed trust root updates

A device's broker credentials allow publishing to its own status/telemetry/events and reading
its own desired/commands/acks plus fleet/trust (see docs/protocol.md for the Mosquitto ACL).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""Device ids are safe as one topic level and as a file name: no '/', '+', '#' or spaces."""


def valid_device_id(device_id: str) -> bool:
    return bool(DEVICE_ID.match(device_id))


@dataclass(frozen=True)
class Topics:
    prefix: str = "edgefleet"

    def device(self, device_id: str, leaf: str) -> str:
        if not valid_device_id(device_id):
            raise ValueError(f"invalid device id {device_id!r}")
        return f"{self.prefix}/devices/{device_id}/{leaf}"

    def status(self, device_id: str) -> str:
        return self.device(device_id, "status")

    def telemetry(self, device_id: str) -> str:
        return self.device(device_id, "telemetry")

    def events(self, device_id: str) -> str:
        return self.device(device_id, "events")

    def desired(self, device_id: str) -> str:
        return self.device(device_id, "desired")

    def commands(self, device_id: str) -> str:
        return self.device(device_id, "commands")

    def acks(self, device_id: str) -> str:
        return self.device(device_id, "acks")

    @property
    def trust(self) -> str:
        return f"{self.prefix}/fleet/trust"

    def all_devices(self, leaf: str) -> str:
        """The control plane's subscription for one leaf of every device."""
        return f"{self.prefix}/devices/+/{leaf}"

    @functools.cached_property
    def _devices(self) -> str:
        return f"{self.prefix}/devices/"

    def parse(self, topic: str) -> tuple[str, str] | None:
        """(device_id, leaf) of a device topic under this prefix, else None. Runs for every
        message the control plane receives: one prefix test and one split."""
        start = self._devices
        if not topic.startswith(start):
            return None
        parts = topic[len(start) :].split("/")
        if len(parts) != 2:
            return None
        device_id, leaf = parts
        return (device_id, leaf) if valid_device_id(device_id) else None
