"""The Kubernetes controller on control plane replicas: only the leader creates the rollout of a
ModelRollout. A replica whose lease was taken over while it still believed it led (its clock
stood still) has its create refused by the fence, writes nothing to the object, and the new
leader creates the rollout. Two control planes built by the real composition root on one
PostgreSQL database; the API server is the fake at the controller's seam (no API server runs
here)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from control_plane.api.deps import Services
from control_plane.db.models import Device, Model, ModelVersion, Rollout
from control_plane.k8s.controller import ModelRolloutController
from control_plane.leadership.lease import Fenced
from control_plane.settings.kubernetes import KubernetesSettings
from tests.control_plane.enrolment.conftest import postgresql_database
from tests.control_plane.leadership.test_fencing import replica
from tests.k3s.fake_kube import FakeKubeApi
from tests.k3s.test_controller import modelrollout

pytestmark = pytest.mark.slow


async def seed(svc: Services) -> None:
    """A validated mlp v2 and one device its selector matches."""
    now = datetime.now(UTC)
    async with svc.sessions.begin() as s:
        model = Model(name="mlp", created_at=now)
        s.add(model)
        await s.flush()
        file = {"name": "model.onnx", "sha256": "0" * 64, "size": 1}
        variant = {"format": "onnx", "profiles": [], "files": [file]}
        s.add(
            ModelVersion(
                model_id=model.id,
                version=2,
                variants=[variant],
                validation={"passed": True},
                uploaded_by="test",
                created_at=now,
            )
        )
        s.add(Device(id="dev-1", desired={}, operator_labels={"site": "lab"}))


async def rollouts(svc: Services) -> int:
    async with svc.sessions() as s:
        return int((await s.execute(select(func.count()).select_from(Rollout))).scalar_one())


def test_a_stale_leaders_controller_cannot_create_a_rollout_fake_k8s_api(tmp_path: Path) -> None:
    with postgresql_database() as db_url:
        a = replica(db_url, tmp_path / "state", "cp-a")
        b = replica(db_url, tmp_path / "state", "cp-b")
        kube = FakeKubeApi()
        kube.apply(modelrollout("mlp-v2", 2))
        settings = KubernetesSettings()

        async def run() -> None:
            lead_a, lead_b = a.engine.leadership, b.engine.leadership
            try:
                await seed(a)
                assert await lead_a.try_acquire()
                # the lease runs out while a's clock stands still; b takes it over
                async with a.sessions.begin() as s:
                    await s.execute(text("UPDATE leader_leases SET expires_at = now()"))
                assert await lead_b.try_acquire()
                assert lead_a.leading  # a still believes it leads: only the epoch stops it

                stale = ModelRolloutController(kube, a.engine, a.sessions, "edgefleet", settings)
                with pytest.raises(Fenced, match="epoch 1 was superseded by 2"):
                    await stale.reconcile(kube.get("mlp-v2"))
                assert await rollouts(a) == 0  # its planned rollout was rolled back
                assert kube.status_patches == []  # and the object not marked Failed
                assert not lead_a.leading  # it knows now

                leader = ModelRolloutController(kube, b.engine, b.sessions, "edgefleet", settings)
                await leader.reconcile(kube.get("mlp-v2"))
                assert await rollouts(b) == 1
                status = kube.get("mlp-v2")["status"]
                async with b.sessions() as s:
                    (rollout,) = (await s.execute(select(Rollout))).scalars()
                assert status["rolloutId"] == rollout.id
                assert rollout.created_by.startswith("modelrollout:edgefleet/mlp-v2@")
            finally:
                for svc in (a, b):
                    await svc.sessions.kw["bind"].dispose()

        asyncio.run(asyncio.wait_for(run(), 60))
