"""What devices publish, into the database: presence, telemetry, update events.

Telemetry and events are queued and written in batches (one transaction per batch, duplicates
ignored by their natural keys), so ingest keeps up with thousands of devices; presence is
rare and written as it comes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agent.protocol.messages import DeviceStatus, Telemetry, UpdateEvent
from control_plane.db.models import Device, DeviceSample, TelemetrySample, UpdateEventRecord
from control_plane.metrics import FleetMetrics

log = logging.getLogger("edgefleet.control_plane.ingest")

EventListener = Callable[[list[UpdateEvent]], Awaitable[None]]


async def insert_ignore(session: AsyncSession, table: Any, rows: list[dict[str, Any]]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING, in the dialect of the session's database."""
    if not rows:
        return
    dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
    stmt = (pg_insert if dialect == "postgresql" else sqlite_insert)(table).on_conflict_do_nothing()
    await session.execute(stmt, rows)


class Ingestor:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        metrics: FleetMetrics,
        *,
        batch_size: int,
        max_delay_s: float,
    ) -> None:
        self.sessions = sessions
        self.metrics = metrics
        self.batch_size = batch_size
        self.max_delay_s = max_delay_s
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=100_000)
        self.listeners: list[EventListener] = []
        self.on_device_online: list[Callable[[str], Awaitable[None]]] = []
        self.stored = 0

    # -- entry points (called by the MQTT adapter) ----------------------------------------

    async def status(self, device_id: str, payload: bytes) -> None:
        if not payload:
            return  # a cleared retained status
        try:
            status = DeviceStatus.model_validate_json(payload)
        except ValidationError as exc:
            self.metrics.rejected("status", "malformed")
            log.warning(
                "status rejected",
                extra={"device_id": device_id, "reason": str(exc.errors()[0]["msg"])},
            )
            return
        if status.device_id != device_id:
            self.metrics.rejected("status", "wrong_device")
            log.warning(
                "status for another device",
                extra={"device_id": device_id, "claimed": status.device_id},
            )
            return
        now = datetime.now(UTC)
        async with self.sessions.begin() as session:
            device = await session.get(Device, device_id)
            if device is None:
                device = Device(
                    id=device_id, operator_labels={}, desired={}, reported_labels={}, models=[]
                )
                session.add(device)
            was_online = device.online
            device.online = status.online
            device.last_seen = now
            if status.online:  # the last will carries no details: keep what the birth said
                device.hardware_profile = status.hardware_profile
                device.agent_version = status.agent_version
                device.reported_labels = dict(status.labels)
                device.models = [m.model_dump() for m in status.models]
        self.metrics.set_online(device_id, status.online)
        if status.online and not was_online:
            for callback in self.on_device_online:
                await callback(device_id)

    async def telemetry(self, device_id: str, payload: bytes) -> None:
        try:
            message = Telemetry.model_validate_json(payload)
        except ValidationError:
            self.metrics.rejected("telemetry", "malformed")
            return
        if message.device_id != device_id:
            self.metrics.rejected("telemetry", "wrong_device")
            return
        await self._queue.put(("telemetry", message))

    async def event(self, device_id: str, payload: bytes) -> None:
        try:
            event = UpdateEvent.model_validate_json(payload)
        except ValidationError:
            self.metrics.rejected("events", "malformed")
            return
        if event.device_id != device_id:
            self.metrics.rejected("events", "wrong_device")
            return
        await self._queue.put(("event", event))

    # -- the batch writer ------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            deadline = time.monotonic() + self.max_delay_s
            while len(batch) < self.batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            try:
                await self._write(batch)
            except Exception:
                # a batch that cannot be written must not stop ingest (a restarted database,
                # a constraint): count it, log it, keep going
                self.metrics.rejected("ingest", "write_failed")
                log.exception("telemetry batch not stored", extra={"messages": len(batch)})

    async def drain(self) -> None:
        """Write whatever is queued now (tests and shutdown)."""
        batch = []
        while not self._queue.empty():
            batch.append(self._queue.get_nowait())
        if batch:
            await self._write(batch)

    async def _write(self, batch: list[tuple[str, Any]]) -> None:
        samples: list[dict[str, Any]] = []
        devices: list[dict[str, Any]] = []
        events: list[UpdateEvent] = []
        seen: dict[str, datetime] = {}
        for kind, message in batch:
            if kind == "event":
                events.append(message)
                continue
            t: Telemetry = message
            seen[t.device_id] = max(seen.get(t.device_id, t.time), t.time)
            devices.append(
                {
                    "device_id": t.device_id,
                    "seq": t.seq,
                    "time": t.time,
                    "cpu_percent": t.device.cpu_percent,
                    "memory_used_bytes": t.device.memory_used_bytes,
                    "temperature_c": t.device.temperature_c,
                    "dropped": t.dropped,
                }
            )
            for m in t.models:
                samples.append(
                    {
                        "device_id": t.device_id,
                        "seq": t.seq,
                        "time": t.time,
                        "window_s": t.window_s,
                        "model": m.model,
                        "version": m.version,
                        "requests": m.requests,
                        "errors": m.errors,
                        "rows": m.rows,
                        "batches": m.batches,
                        "p50_ms": m.p50_ms,
                        "p95_ms": m.p95_ms,
                        "p99_ms": m.p99_ms,
                        "queue_depth": m.queue_depth,
                    }
                )
        async with self.sessions.begin() as session:
            await insert_ignore(session, DeviceSample.__table__, devices)
            await insert_ignore(session, TelemetrySample.__table__, samples)
            await insert_ignore(
                session,
                UpdateEventRecord.__table__,
                [
                    {
                        "event_id": e.event_id,
                        "device_id": e.device_id,
                        "time": e.time,
                        "model": e.model,
                        "version": e.version,
                        "sequence": e.sequence,
                        "rollout_id": e.rollout_id,
                        "state": e.state.value,
                        "code": e.code,
                        "reason": e.reason,
                    }
                    for e in events
                ],
            )
            if seen:
                await session.execute(  # an ORM bulk UPDATE by primary key
                    update(Device),
                    [{"id": d, "last_seen": w} for d, w in seen.items()],
                )
        self.stored += len(batch)
        self.metrics.ingested(samples, len(devices), len(events))
        if events:
            for listener in self.listeners:
                await listener(events)
