"""Runs ModelRollout objects as rollouts and writes their progress into ``.status``.

Level-triggered: list every object and reconcile it, then follow a watch until the server ends
it (``resync_s``), then list again. Reconciling an object:

- no rollout yet: adopt the latest rollout of its model and version that an object of its
  namespace and name created (the status write may have been lost, or the object deleted and
  restored from Git without its status), else create it; a spec the engine refuses becomes
  phase Failed with the reason, one that must wait for another rollout of its model on the
  same devices to end stays Pending (condition Accepted False, reason Waiting) and is tried
  again every ``status_interval_s``;
- ``spec.paused`` / ``spec.abort``: pause, resume or abort (abort rolls back);
- write the rollout's state as ``.status`` when it changed. The rest of the spec cannot change
  under a rollout: an edit of it keeps ``.status.observedGeneration`` at the generation the
  rollout runs and sets the condition SpecApplied False (reason ImmutableWhileRunning).

Active rollouts are also written every ``status_interval_s``: the engine moves them on device
events and timers that the API server knows nothing of.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import selectinload

from control_plane.db.models import Rollout
from control_plane.db.states import RolloutState
from control_plane.errors import Busy, Conflict, ControlPlaneError
from control_plane.k8s.api import KubeApi, Obj
from control_plane.k8s.resource import (
    FINAL,
    clip,
    conditions,
    merged,
    rollout_conditions,
    rollout_spec,
    rollout_status,
    spec_changes,
)
from control_plane.leadership.lease import Fenced
from control_plane.rollouts.engine import RolloutEngine
from control_plane.settings.kubernetes import KubernetesSettings

log = logging.getLogger("edgefleet.control_plane.k8s")

REASONS = {"invalid_request": "InvalidSpec", "not_found": "NotFound", "conflict": "Refused"}


def owner(obj: Obj) -> str:
    """Who created a rollout (its ``created_by``): the object, and which incarnation of it
    (its uid, for the audit trail; adoption ignores it, see :func:`owner_prefix`)."""
    return owner_prefix(obj) + str(obj["metadata"]["uid"])[:8]


def owner_prefix(obj: Obj) -> str:
    """What every ``created_by`` of an object of this namespace and name starts with."""
    meta = obj["metadata"]
    return f"modelrollout:{meta['namespace']}/{meta['name']}"[:110] + "@"


class ModelRolloutController:
    def __init__(
        self,
        api: KubeApi,
        engine: RolloutEngine,
        sessions: async_sessionmaker[AsyncSession],
        namespace: str,
        settings: KubernetesSettings,
    ) -> None:
        self.api = api
        self.engine = engine
        self.sessions = sessions
        self.namespace = namespace
        self.settings = settings
        self.objects: dict[str, Obj] = {}
        """The latest version of every ModelRollout seen, by name."""

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._follow(), name="k8s-modelrollouts")
            tasks.create_task(self._write_progress(), name="k8s-modelrollout-status")

    async def _follow(self) -> None:
        delay = 0.5
        while True:
            try:
                items, version = await self.api.list_rollouts(self.namespace)
                self.objects = {o["metadata"]["name"]: o for o in items}
                for obj in items:
                    await self._reconcile_logged(obj)
                delay = 0.5
                async for kind, obj in self.api.watch_rollouts(
                    self.namespace, version, self.settings.resync_s
                ):
                    name = obj["metadata"]["name"]
                    if kind == "DELETED":
                        self.objects.pop(name, None)
                    elif kind in ("ADDED", "MODIFIED"):
                        self.objects[name] = obj
                        await self._reconcile_logged(obj)
            except Exception:
                log.exception("watching ModelRollouts failed; retrying", extra={"in_s": delay})
                await asyncio.sleep(delay)  # back off while the API server is away
                delay = min(delay * 2, self.settings.retry_max_s)

    async def _write_progress(self) -> None:
        while True:
            await asyncio.sleep(self.settings.status_interval_s)
            for obj in list(self.objects.values()):
                status = obj.get("status") or {}
                if status.get("rolloutId") is None and status.get("phase") == "Pending":
                    await self._reconcile_logged(obj)  # waiting for another rollout to end
                    continue
                if status.get("rolloutId") is None or status.get("phase") in FINAL:
                    continue
                try:
                    await self.sync_status(obj, int(status["rolloutId"]))
                except Exception:
                    log.exception(
                        "writing ModelRollout status failed", extra={"modelrollout": _name(obj)}
                    )

    async def _reconcile_logged(self, obj: Obj) -> None:
        try:
            await self.reconcile(obj)
        except Fenced as exc:  # the lease is lost: while_leading stops this loop
            log.warning("not leading: ModelRollout left to the leader", extra={"reason": str(exc)})
        except Exception:  # one bad object must not stop the others
            log.exception("reconciling a ModelRollout failed", extra={"modelrollout": _name(obj)})

    async def reconcile(self, obj: Obj) -> None:
        status = obj.get("status") or {}
        generation = int(obj["metadata"].get("generation", 1))
        spec = obj.get("spec") or {}
        rollout_id = status.get("rolloutId")
        if rollout_id is None:
            if status.get("phase") == "Failed" and status.get("observedGeneration") == generation:
                return  # already reported
            rollout_id = await self._adopt(obj) or await self._create(obj)
            if rollout_id is None:
                return
        rollout_id = int(rollout_id)
        await self._act(obj, rollout_id, spec)
        await self.sync_status(obj, rollout_id)

    async def _adopt(self, obj: Obj) -> int | None:
        """The rollout an object of this namespace and name created for the same model and
        version, whatever its uid: a lost status write, or an object deleted and re-created
        (restored from Git, a prune and re-sync, ``kubectl replace``) reports that rollout's
        result instead of rolling the version out a second time."""
        spec = obj.get("spec") or {}
        model, version = spec.get("model"), spec.get("version")
        if not isinstance(model, str) or not isinstance(version, int):
            return None  # _create reports what is wrong with the spec
        async with self.sessions() as session:
            found = (
                await session.execute(
                    select(Rollout.id)
                    .where(
                        Rollout.created_by.startswith(owner_prefix(obj), autoescape=True),
                        Rollout.model == model,
                        Rollout.version == version,
                    )
                    .order_by(Rollout.id.desc())
                    .limit(1)
                )
            ).scalar_one_or_none()
        return found

    async def _create(self, obj: Obj) -> int | None:
        generation = int(obj["metadata"].get("generation", 1))
        try:
            if (obj.get("spec") or {}).get("abort"):
                raise Conflict("spec.abort: the rollout was aborted before it started")
            # fenced: a replica that lost the lease while it believed it led (paused, its
            # renewals late) must not start a rollout the new leader starts too
            rollout_id = await self.engine.create(rollout_spec(obj), owner(obj), fenced=True)
        except Fenced:
            raise  # not the object's fault: its status stays the leader's to write
        except Busy as exc:
            # not refused: it starts once the rollout in its way is done (tried again on every
            # progress write, see _write_progress)
            log.info(
                "ModelRollout waiting", extra={"modelrollout": _name(obj), "reason": exc.message}
            )
            previous = (obj.get("status") or {}).get("conditions") or []
            await self._patch(
                obj,
                {
                    "observedGeneration": generation,
                    "phase": "Pending",
                    "message": clip(exc.message),
                    "conditions": conditions(
                        previous, [("Accepted", False, "Waiting", exc.message)], generation, _now()
                    ),
                },
            )
            return None
        except ControlPlaneError as exc:
            reason = REASONS.get(exc.code, "Refused")
            log.warning(
                "ModelRollout refused", extra={"modelrollout": _name(obj), "reason": exc.message}
            )
            previous = (obj.get("status") or {}).get("conditions") or []
            await self._patch(
                obj,
                {
                    "observedGeneration": generation,
                    "phase": "Failed",
                    "message": clip(exc.message),
                    "conditions": conditions(
                        previous, [("Accepted", False, reason, exc.message)], generation, _now()
                    ),
                },
            )
            return None
        log.info("ModelRollout started", extra={"modelrollout": _name(obj), "rollout": rollout_id})
        return rollout_id

    async def _act(self, obj: Obj, rollout_id: int, spec: Obj) -> None:
        async with self.sessions() as session:
            rollout = await session.get(Rollout, rollout_id)
        if rollout is None:
            return
        try:
            running, paused = RolloutState.RUNNING, RolloutState.PAUSED
            if spec.get("abort") and rollout.state in (running, paused):
                await self.engine.abort(rollout_id, owner(obj))
            elif spec.get("paused") and rollout.state is running:
                await self.engine.pause(rollout_id)
            elif not spec.get("paused") and rollout.state is paused:
                await self.engine.resume(rollout_id)
        except Conflict:
            pass  # the rollout moved on meanwhile (finished, or rolled back by a gate)

    async def sync_status(self, obj: Obj, rollout_id: int) -> None:
        """Write the rollout's state into the object's ``.status`` if it differs."""
        async with self.sessions() as session:
            rollout = (
                await session.execute(
                    select(Rollout)
                    .where(Rollout.id == rollout_id)
                    .options(selectinload(Rollout.devices))
                )
            ).scalar_one_or_none()
        if rollout is None:
            return
        generation = int(obj["metadata"].get("generation", 1))
        current = obj.get("status") or {}
        changed = spec_changes(obj, rollout)
        # observedGeneration is the generation the rollout runs: an edit it cannot apply
        # leaves it where it was, and SpecApplied says why
        applied = current.get("observedGeneration") if changed else generation
        status = rollout_status(rollout, applied)
        status["conditions"] = conditions(
            current.get("conditions") or [],
            rollout_conditions(status, rollout, changed),
            generation,
            _now(),
        )
        for key in ("gateReport", "rollback"):
            if key not in status and key in current:
                status[key] = None  # (merge patch: null removes it)
        if merged(current, status) != current:
            await self._patch(obj, status)

    async def _patch(self, obj: Obj, status: Obj) -> None:
        name = obj["metadata"]["name"]
        updated = await self.api.patch_rollout_status(self.namespace, name, status)
        if name in self.objects:
            self.objects[name] = updated


def _name(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("name", "?"))


def _now() -> datetime:
    return datetime.now(UTC)
