"""Fencing: a leader whose lease was taken over cannot write or publish for the singleton
loops. Two control planes built by the real composition root on one PostgreSQL database, a
rollout row to step, and the lease taken over while the first still counts itself the leader
(its clock stood still: a suspended VM, whose monotonic clock does not advance)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, text

from common.protocol.messages import ArtifactVariant, FileRef, ModelManifest
from control_plane.api.deps import Services
from control_plane.db.models import Device, Rollout, RolloutDevice
from control_plane.db.states import DeviceRolloutState, RolloutState
from control_plane.leadership.lease import Fenced, Leadership
from control_plane.main import build
from control_plane.settings import ControlPlaneSettings
from tests.control_plane.enrolment.conftest import postgresql_database

pytestmark = pytest.mark.slow

FILE = FileRef(name="model.onnx", url="http://127.0.0.1:1/a", sha256="0" * 64, size=1)


def leads(leadership: Leadership) -> bool:
    return leadership.leading


def replica(db_url: str, state_dir: Path, name: str) -> Services:
    settings = ControlPlaneSettings(
        db_url=db_url,
        mqtt_url="mqtt://127.0.0.1:1",  # never connected: the bus only queues here
        mqtt_client_id=name,
        mqtt_shared_group="cp",
        state_dir=state_dir,
        artifact_dir=state_dir / "artifacts",
        leader_lease_ttl_s=2.0,
        leader_renew_interval_s=0.5,
    )
    services, _ = build(settings)
    return services


async def add_rollout(a: Services) -> int:
    now = datetime.now(UTC)
    async with a.sessions.begin() as s:
        s.add(Device(id="dev-1", desired={}))
        rollout = Rollout(
            model="mlp",
            version=2,
            sequence=1,
            manifest=ModelManifest(
                model="mlp",
                version=2,
                sequence=1,
                artifacts=[ArtifactVariant(format="onnx", files=[FILE])],
                issued_at=now,
                expires_at=now + timedelta(days=1),
            ).model_dump(mode="json"),
            waves=[1],
            bake_time_s=0,
            device_timeout_s=60,
            gates={"allow_unjudged": True},
            state=RolloutState.RUNNING,
            created_by="test",
            created_at=now,
            updated_at=now,
        )
        s.add(rollout)
        await s.flush()
        s.add(
            RolloutDevice(
                rollout_id=rollout.id,
                device_id="dev-1",
                position=0,
                wave=0,
                state=DeviceRolloutState.PENDING,
            )
        )
        return rollout.id


async def device_state(
    svc: Services, rollout_id: int
) -> tuple[DeviceRolloutState, dict[str, object]]:
    async with svc.sessions() as s:
        rd = (
            await s.execute(select(RolloutDevice).where(RolloutDevice.rollout_id == rollout_id))
        ).scalar_one()
        device = await s.get(Device, "dev-1")
        assert device is not None
        return rd.state, device.desired


def test_a_leader_whose_lease_was_taken_over_cannot_write_or_publish(tmp_path: Path) -> None:
    with postgresql_database() as db_url:
        a = replica(db_url, tmp_path / "state", "cp-a")
        b = replica(db_url, tmp_path / "state", "cp-b")

        async def run() -> None:
            lead_a, lead_b = a.engine.leadership, b.engine.leadership
            try:
                assert await lead_a.try_acquire()
                assert not await lead_b.try_acquire()  # held, not expired
                assert leads(lead_a) and not leads(lead_b)
                rollout_id = await add_rollout(a)
                # the lease runs out while a's clock stands still; b takes it over
                async with a.sessions.begin() as s:
                    await s.execute(text("UPDATE leader_leases SET expires_at = now()"))
                assert await lead_b.try_acquire()
                assert (lead_a.epoch, lead_b.epoch) == (1, 2)
                assert leads(lead_a)  # a still believes it leads: only the epoch stops it

                with pytest.raises(Fenced, match="epoch 1 was superseded by 2"):
                    await a.engine.step(rollout_id)
                assert await device_state(a, rollout_id) == (DeviceRolloutState.PENDING, {})
                assert a.bus.backlog == 0  # nothing published
                assert not leads(lead_a)  # and it knows it now
                assert not await lead_a.try_acquire()  # b's lease holds

                await b.engine.step(rollout_id)  # the same step under the current epoch
                state, desired = await device_state(b, rollout_id)
                assert state is DeviceRolloutState.SENT and set(desired) == {"mlp"}
                assert b.bus.backlog == 1  # its desired state, queued for the broker
            finally:
                for svc in (a, b):
                    await svc.sessions.kw["bind"].dispose()

        asyncio.run(run())


def test_the_lease_moves_when_its_holder_stops_renewing_and_at_release(tmp_path: Path) -> None:
    with postgresql_database() as db_url:
        a = replica(db_url, tmp_path / "state", "cp-a")

        async def run() -> None:
            sessions = a.sessions
            first = Leadership(sessions, "first", single=False, ttl_s=0.6, renew_interval_s=0.2)
            second = Leadership(sessions, "second", single=False, ttl_s=0.6, renew_interval_s=0.2)
            try:
                assert await first.try_acquire() and first.epoch == 1
                assert await first.try_acquire() and first.epoch == 1  # renewed, same epoch
                assert not await second.try_acquire()
                await asyncio.sleep(0.7)  # first stops renewing: its lease expires
                assert not leads(first)  # its own clock said so first
                assert await second.try_acquire() and second.epoch == 2
                await second.release()  # a clean stop hands over at once
                assert not leads(second)
                assert await first.try_acquire() and first.epoch == 3
            finally:
                await sessions.kw["bind"].dispose()

        asyncio.run(run())
