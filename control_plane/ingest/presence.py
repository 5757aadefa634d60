"""Whether a device is online: its last status, checked against how long it has been silent.

A device's retained status on the broker says online from its birth message until its last will
replaces it. Sometimes the will never comes:

- the broker was killed and restarted from its persistence: it still holds the birth, and the
  connection it lost never had its will published;
- the agent's connection ended with a clean DISCONNECT after an error (a publish that timed out
  on a slow broker), which makes the broker drop the will, and the agent was stopped before it
  reconnected.

Either way the inventory would show the device online until it came back. So an online device
from which the control plane has heard nothing (no telemetry, event or status) for longer than
its silence limit is shown as ``silent``, and not online: the limit is the larger of
``presence_timeout_s`` and three of the telemetry intervals the device announced. Silence is
counted only while the control plane listens to the broker and stores what arrives
(``FleetMetrics.hearing_since``): after its own restart, a lost broker connection or a database
outage, every device gets a full limit from the moment it hears again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from control_plane.db.session import stored_utc

SILENT_INTERVALS = 3
"""Telemetry intervals a device may miss before it counts as silent."""


class Presence(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"
    """Its last status says so: a clean shutdown or its last will."""
    SILENT = "silent"
    """Its last status says online, but nothing has come from it for longer than its limit."""


@dataclass(frozen=True)
class SilenceRule:
    timeout_s: float
    """The least silence that makes an online device silent; 0 turns the check off."""
    resolution_s: float = 0.0
    """How far a recorded ``last_seen`` may lag the device's last message (it is rewritten
    only once it has moved this far): added to every limit."""

    def limit(self, interval_s: float | None) -> timedelta | None:
        """How long a device announcing ``interval_s`` may stay silent: the larger of
        ``timeout_s`` and :data:`SILENT_INTERVALS` of its intervals (None: never silent)."""
        if self.timeout_s <= 0:
            return None
        limit = max(self.timeout_s, SILENT_INTERVALS * interval_s if interval_s else 0.0)
        return timedelta(seconds=limit + self.resolution_s)

    def presence(
        self,
        online: bool,
        last_seen: datetime | None,
        interval_s: float | None,
        *,
        now: datetime,
        hearing_since: datetime | None,
    ) -> Presence:
        """A device's presence at ``now`` (aware, UTC). ``last_seen`` without a zone is UTC
        (SQLite drops it); ``hearing_since`` is since when the control plane has heard and
        stored device messages (None: it cannot now, so silence cannot be told from its own
        deafness and the status stands)."""
        if not online:
            return Presence.OFFLINE
        limit = self.limit(interval_s)
        if limit is None or hearing_since is None:
            return Presence.ONLINE
        heard = hearing_since
        if last_seen is not None:
            heard = max(heard, stored_utc(last_seen))
        return Presence.SILENT if now - heard > limit else Presence.ONLINE
