"""Leadership among control plane replicas: a lease row in PostgreSQL with an expiry and a
fencing epoch.

Every replica ingests (MQTT shared subscriptions) and serves the API; exactly one runs the
loops that must not run twice (the rollout engine, the deployments reconciler, telemetry
maintenance). A replica takes the lease when it is free or expired, by the database's clock,
and renews it every ``renew_interval_s``; each grant to a new holder increments the epoch.

A paused leader (a long GC, SIGSTOP, a VM migration) still believes it leads when it wakes, so
belief is not enough (https://martin.kleppmann.com/2016/02/08/how-to-distributed-locking.html):

* every transaction of the leader's loops checks, before it commits, that the lease row still
  holds its epoch (:meth:`Leadership.fence`, which reads the row ``FOR SHARE``, so a takeover
  waits for that commit and no write slips past it); a stale epoch raises :class:`Fenced` and
  the transaction, and what it would have published, is dropped;
* a leader stops acting on its own clock before anyone else can take over: its lease counts
  as held only until ``ttl_s - renew_interval_s`` after the start of its last renewal, while
  the database frees it ``ttl_s`` after that renewal's end.

A lease row rather than ``pg_try_advisory_lock``: an advisory lock is freed only when its
session ends, so a paused leader keeps it while its connection lives, and PgBouncer's
transaction pooling breaks it. On SQLite there is one replica: it always leads, epoch 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from control_plane.db.models import LeaderLease
from control_plane.errors import ControlPlaneError

log = logging.getLogger("edgefleet.control_plane.leadership")
LEASE = "control-plane"
"""The one lease the singleton loops share."""

_TAKE = text(
    """
    INSERT INTO leader_leases (name, holder, epoch, expires_at)
    VALUES (:name, :holder, 1, now() + make_interval(secs => :ttl_s))
    ON CONFLICT (name) DO UPDATE
        SET holder = excluded.holder,
            epoch = leader_leases.epoch + 1,
            expires_at = excluded.expires_at
        WHERE leader_leases.expires_at < now()
    RETURNING epoch
    """
)
"""Take the lease if nobody ever held it or its holder let it expire: the new epoch, or no row."""
_RENEW = text(
    """
    UPDATE leader_leases SET expires_at = now() + make_interval(secs => :ttl_s)
    WHERE name = :name AND epoch = :epoch
    RETURNING epoch
    """
)
_RELEASE = text("UPDATE leader_leases SET expires_at = now() WHERE name = :name AND epoch = :epoch")
_HOLDER = text("SELECT holder, epoch FROM leader_leases WHERE name = :name AND expires_at > now()")
"""Who leads (when a replica failed to take the lease): for /health and /metrics."""


class Fenced(ControlPlaneError):
    """This replica no longer holds the lease (or never did): what it was about to write or
    publish for a singleton loop is refused."""

    code = "not_leader"


Loop = Callable[[], Coroutine[Any, Any, None]]


class Leadership:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        holder: str,
        *,
        single: bool,
        ttl_s: float,
        renew_interval_s: float,
    ) -> None:
        """``single``: the only replica (SQLite): it leads from the start, and never checks."""
        self.sessions = sessions
        self.holder = holder[:128]
        self.single = single
        self.ttl_s = ttl_s
        self.renew_interval_s = renew_interval_s
        self.epoch: int | None = 0 if single else None
        """The epoch of the lease this replica holds, None while it follows."""
        self._valid_until = 0.0
        """``time.monotonic()`` past which this replica stops counting itself the leader."""
        self.changed = asyncio.Event()
        """Set at every gain or loss (:meth:`while_leading` waits on it)."""
        self.leader: tuple[str, int] | None = (self.holder, 0) if single else None
        """The leader as this replica last saw it (holder, epoch), at each try to take or
        renew the lease; None: no one held it."""
        self.on_leader: list[Callable[[Leadership], None]] = []
        """Called after each try (the metrics follow :attr:`leader`)."""

    @property
    def leading(self) -> bool:
        return self.single or (self.epoch is not None and time.monotonic() < self._valid_until)

    async def fence(self, session: AsyncSession) -> None:
        """Refuse (:class:`Fenced`) the transaction of ``session`` unless this replica holds
        the lease at this epoch; call it last, just before the commit."""
        if self.single:
            return
        epoch = self.epoch
        if epoch is None or not self.leading:
            raise Fenced("this replica does not lead")
        current = (
            await session.execute(
                select(LeaderLease.epoch)
                .where(LeaderLease.name == LEASE)
                .with_for_update(read=True)
            )
        ).scalar_one_or_none()
        if current != epoch:
            self._lose(f"epoch {epoch} superseded by {current}")
            raise Fenced(f"epoch {epoch} was superseded by {current}")

    async def try_acquire(self) -> bool:
        """Take or renew the lease, once; whether this replica leads now."""
        if self.single:
            return True
        started = time.monotonic()
        params = {"name": LEASE, "holder": self.holder, "ttl_s": self.ttl_s}
        held = None
        async with self.sessions.begin() as session:
            epoch = None
            if self.epoch is not None:
                renewed = await session.execute(_RENEW, {**params, "epoch": self.epoch})
                epoch = renewed.scalar_one_or_none()
                if epoch is None:
                    self._lose("the lease was taken over")
            if epoch is None:  # taken again if it is free now: a new epoch
                epoch = (await session.execute(_TAKE, params)).scalar_one_or_none()
            if epoch is None:
                held = (await session.execute(_HOLDER, {"name": LEASE})).one_or_none()
        if epoch is None:
            self._seen((str(held[0]), int(held[1])) if held is not None else None)
            return False
        if self.epoch is None:
            log.info("leading", extra={"epoch": epoch, "holder": self.holder})
            self.changed.set()
        self.epoch = int(epoch)
        self._valid_until = started + self.ttl_s - self.renew_interval_s
        self._seen((self.holder, self.epoch))
        return True

    def _seen(self, leader: tuple[str, int] | None) -> None:
        self.leader = leader
        for callback in self.on_leader:
            callback(self)

    def view(self) -> dict[str, Any]:
        """The leader, as ``/health`` shows it: its id (``<mqtt_client_id>:<pid>``), its
        epoch, and whether it is this replica."""
        holder, epoch = self.leader if self.leader is not None else (None, None)
        return {"id": holder, "epoch": epoch, "this_replica": self.leading}

    async def release(self) -> None:
        """Let the lease expire now (a clean stop): another replica takes it at its next try."""
        epoch, self.epoch = self.epoch, None
        if self.single or epoch is None:
            return
        async with self.sessions.begin() as session:
            await session.execute(_RELEASE, {"name": LEASE, "epoch": epoch})

    def _lose(self, why: str) -> None:
        if self.epoch is not None:
            log.warning("no longer leading", extra={"epoch": self.epoch, "reason": why})
            self.changed.set()
        self.epoch = None

    async def run(self, **loops: Loop) -> None:
        """Keep the lease (take it, renew it) and run ``loops`` (task names to functions)
        while this replica leads, until cancelled; then let the lease go."""
        if self.single:
            await _together(loops)
            return
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._keep(), name="leader-lease")
            tg.create_task(self.while_leading(**loops), name="leader-loops")

    async def while_leading(self, **loops: Loop) -> None:
        """Run ``loops`` whenever this replica leads, as :meth:`run` keeps the lease: start
        them at every gain, cancel them at every loss (a lease not renewed in time, or taken
        over). For loops started apart from :meth:`run` (the Kubernetes controller)."""
        if self.single:
            await _together(loops)
            return
        running: asyncio.Task[None] | None = None
        try:
            while True:
                self.changed.clear()
                if self.leading and running is None:
                    running = asyncio.create_task(_together(loops), name="leader-loops")
                elif not self.leading and running is not None:
                    await _cancel(running)
                    running = None
                if running is not None and running.done():
                    running.result()  # a loop ended by a bug: raise it, do not hide it
                # a gain or loss wakes this at once; the lease running out on this replica's
                # clock is seen within a renewal
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.renew_interval_s):
                        await self.changed.wait()
        finally:
            if running is not None:
                await _cancel(running)

    async def _keep(self) -> None:
        try:
            while True:
                try:
                    # as long as the lease can still be saved: a renewal slowed by a loaded
                    # database must not give it up (every loss restarts the leader's loops)
                    timeout_s = self.ttl_s - self.renew_interval_s
                    await asyncio.wait_for(self.try_acquire(), timeout=timeout_s)
                except Exception as exc:  # the database away or slow: the lease runs out
                    log.warning("lease not renewed", extra={"error": repr(exc)})
                if self.epoch is not None and not self.leading:
                    self._lose("lease not renewed in time")
                await asyncio.sleep(self.renew_interval_s)
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.renew_interval_s):
                    await self.release()


async def _together(loops: dict[str, Loop]) -> None:
    async with asyncio.TaskGroup() as tg:
        for name, loop in loops.items():
            tg.create_task(loop(), name=name)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
