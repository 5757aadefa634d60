"""Captured samples from the spool to the control plane, acknowledged and resumable.

Samples ride the device's telemetry topic as :class:`~common.protocol.capture.CaptureUpload`
messages (a device may publish nowhere else), oldest first, a few per message. A sample
stays in the spool until a :class:`~common.protocol.capture.CaptureAck` names it; one sent
and not acknowledged within ``resend_s`` is sent again, as is everything in flight after a
reconnect. At most ``MAX_IN_FLIGHT`` samples are unacknowledged at once, so a control plane
that is slow to store them is not flooded. The control plane stores a sample once by its id,
so a resend costs bandwidth, never a duplicate.
"""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime

from agent.fleet.settings import FleetSettings
from agent.inference.capture import CaptureTap, ModelCounts
from common.protocol.capture import (
    MAX_UPLOAD_BYTES,
    MAX_UPLOAD_SAMPLES,
    CapturedSample,
    CaptureUpload,
)

MAX_IN_FLIGHT = 4 * MAX_UPLOAD_SAMPLES
"""Samples sent and not yet acknowledged, at most."""


class CaptureUploader:
    def __init__(self, tap: CaptureTap, device_id: str, settings: FleetSettings) -> None:
        self.tap = tap
        self.device_id = device_id
        self.resend_s = settings.telemetry_resend_s
        self.shown: dict[str, ModelCounts] = {}
        """The counts the last status showed, per model (a change publishes a new one)."""
        self._in_flight: dict[str, float] = {}
        """Samples sent and not acknowledged: id -> when they are due again (monotonic)."""
        self.wake = asyncio.Event()
        """Set when a sample was stored or acknowledged: there may be more to send."""

    def reconnected(self) -> None:
        """A new session: everything in flight may have been lost with the old one."""
        self._in_flight.clear()

    def next_upload(self, now: float) -> CaptureUpload | None:
        """The next message to publish (its samples now in flight), or None."""
        for sid, due in list(self._in_flight.items()):
            if due <= now:  # not acknowledged in time: sent again
                del self._in_flight[sid]
        room = min(MAX_UPLOAD_SAMPLES, MAX_IN_FLIGHT - len(self._in_flight))
        if room <= 0:
            return None
        samples: list[CapturedSample] = []
        size = 0
        for sample in self.tap.spool.oldest(room, skip=self._in_flight):
            data = base64.b64encode(sample.data).decode()
            if samples and size + len(data) > MAX_UPLOAD_BYTES:
                break
            size += len(data)
            samples.append(
                CapturedSample(
                    sample_id=sample.sample_id,
                    model=sample.model,
                    version=sample.version,
                    captured_at=datetime.fromtimestamp(sample.captured_at, UTC),
                    trigger=sample.trigger,
                    rows=sample.rows,
                    data_b64=data,
                )
            )
        if not samples:
            return None
        for s in samples:
            self._in_flight[s.sample_id] = now + self.resend_s
        return CaptureUpload(device_id=self.device_id, samples=samples)

    def next_due_s(self, now: float) -> float | None:
        """Seconds until an unacknowledged sample is due again; None: none in flight."""
        if not self._in_flight:
            return None
        return max(0.0, min(self._in_flight.values()) - now)

    def acknowledged(self, sample_ids: list[str]) -> None:
        """The control plane stored these: they leave the spool."""
        gone = self.tap.spool.delete(sample_ids)
        for sid in sample_ids:
            self._in_flight.pop(sid, None)
        self.tap.uploaded(gone)
        self.wake.set()
