"""The reconciler: at every pass, each deployment's devices that are out of compliance, online,
not held by an active rollout of the model and not given up on get a rollout of the
deployment's version, restricted to them (see :mod:`.view` for the states)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from control_plane.deployments.spec import rollout_spec
from control_plane.deployments.view import Compliance, load_view
from control_plane.errors import ControlPlaneError
from control_plane.rollouts.engine import RolloutEngine

log = logging.getLogger("edgefleet.control_plane.deployments")


class DeploymentReconciler:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        engine: RolloutEngine,
        *,
        tick_s: float,
    ) -> None:
        self.sessions = sessions
        self.engine = engine
        self.tick_s = tick_s
        self.problems: dict[int, str] = {}
        """Per deployment, why its last pass started no rollout it needed (shown in its status)."""
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Reconcile now (a deployment was created or changed)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.reconcile()
            except Exception:
                # the database away: the next pass tries again
                log.exception("deployment pass failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick_s):
                    await self._wake.wait()

    async def reconcile(self) -> list[int]:
        """One pass; the ids of the rollouts it started."""
        async with self.sessions() as session:
            fleet = await load_view(session)
        started = []
        for deployment_id, view in fleet.deployments.items():
            d = view.deployment
            if d.paused_by is not None:  # an operator holds it: nothing starts
                self.problems.pop(deployment_id, None)
                continue
            states = fleet.states(deployment_id)
            due = sorted(i for i, state in states.items() if state is Compliance.PENDING)
            if not due:
                self.problems.pop(deployment_id, None)
                continue
            late = view.had_rollout
            try:
                rollout_id = await self.engine.create(
                    rollout_spec(d, late=late),
                    f"deployment:{d.name}",
                    only=set(due),
                    deployment_id=d.id,
                    fenced=True,  # a loop of the leader's: a stale one starts nothing
                )
            except ControlPlaneError as exc:  # not validated, archived, busy meanwhile...
                if self.problems.get(deployment_id) != exc.message:
                    log.warning(
                        "deployment cannot roll out",
                        extra={"deployment": d.name, "reason": exc.message},
                    )
                self.problems[deployment_id] = exc.message
                continue
            self.problems.pop(deployment_id, None)
            started.append(rollout_id)
            log.info(
                "deployment rollout started",
                extra={
                    "deployment": d.name,
                    "rollout": rollout_id,
                    "devices": len(due),
                    "late": late,
                },
            )
        return started
