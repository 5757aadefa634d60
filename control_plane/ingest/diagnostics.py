"""Devices' answers to log and support-bundle requests, appended chunk by chunk to their
``device_diagnostics`` row (:mod:`common.protocol.diagnostics`).

A chunk is appended only if its ``offset`` is the length held (a resend of one held already,
or one past a gap, changes nothing) and only within the answer's declared size and the
request's ``max_bytes``; every chunk is answered with a :class:`DiagnosticAck` naming the
bytes held, from which the device goes on. An answer for a request the control plane does not
hold, or holds for another device, is dropped unanswered.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from common.protocol.diagnostics import MAX_DIAGNOSTIC_BYTES, DiagnosticAck, DiagnosticUpload
from control_plane.db.models import DeviceDiagnostic

log = logging.getLogger("edgefleet.control_plane.diagnostics")

Ack = Callable[[], None]
QUEUED = 64
"""Chunks waiting to be stored; one past it is left to the device's resend."""
DONE = ("complete", "failed")


class DiagnosticReceiver:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], publish_ack: Callable[[str, bytes], None]
    ) -> None:
        self.sessions = sessions
        self.publish_ack = publish_ack
        self._queue: asyncio.Queue[tuple[str, DiagnosticUpload, Ack | None]] = asyncio.Queue(QUEUED)

    def offer(self, device_id: str, upload: DiagnosticUpload, ack: Ack | None) -> None:
        try:
            self._queue.put_nowait((device_id, upload, ack))
        except asyncio.QueueFull:
            if ack is not None:
                ack()  # dropped: the device sends it again, unacknowledged

    async def run(self) -> None:
        while True:
            device_id, upload, ack = await self._queue.get()
            try:
                answer = await self._store(device_id, upload)
            except Exception:
                log.exception("diagnostic chunk not stored", extra={"device_id": device_id})
                answer = None
            finally:
                if ack is not None:
                    ack()
            if answer is not None:
                self.publish_ack(device_id, answer.model_dump_json().encode())

    async def _store(self, device_id: str, upload: DiagnosticUpload) -> DiagnosticAck | None:
        async with self.sessions() as s:
            row = await s.get(DeviceDiagnostic, upload.request_id)
            if row is None or row.device_id != device_id:
                return None
            if row.state not in DONE:
                append_chunk(row, upload)
                await s.commit()
            return DiagnosticAck(
                device_id=device_id,
                request_id=row.id,
                received_bytes=row.received_bytes,
                done=row.state in DONE,
            )


def fail(row: DeviceDiagnostic, why: str) -> None:
    row.state, row.error, row.completed_at = "failed", why[:500], datetime.now(UTC)


def append_chunk(row: DeviceDiagnostic, upload: DiagnosticUpload) -> None:
    if upload.error:
        return fail(row, f"the device: {upload.error}")
    cap = min(int(row.params.get("max_bytes") or MAX_DIAGNOSTIC_BYTES), MAX_DIAGNOSTIC_BYTES)
    if upload.total_bytes > cap:
        return fail(row, f"the answer's {upload.total_bytes} bytes exceed max_bytes {cap}")
    if row.total_bytes is None:
        row.total_bytes = upload.total_bytes
    elif row.total_bytes != upload.total_bytes:
        return fail(row, f"total_bytes changed from {row.total_bytes} to {upload.total_bytes}")
    if upload.offset != row.received_bytes:
        return None  # a resend of what is held, or past a gap: the ack says where to go on
    try:
        chunk = base64.b64decode(upload.data_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        return fail(row, f"data_b64: {exc}")
    if upload.offset + len(chunk) > row.total_bytes:
        return fail(row, "a chunk runs past total_bytes")
    row.data = bytes(row.data or b"") + chunk
    row.received_bytes += len(chunk)
    if row.received_bytes == row.total_bytes:
        row.state, row.completed_at = "complete", datetime.now(UTC)
    else:
        row.state = "uploading"
    return None
