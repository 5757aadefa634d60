"""Where a device enrolled by claim gets its broker user: Mosquitto's dynamic security plugin
(at once, no reload) or the fleet's password file and ACL (``edgefleet fleet``; the broker
rereads them on SIGHUP, sent here when its pid file can be read)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from common.protocol.topics import Topics
from control_plane.enrolment.batching import GroupCommit
from control_plane.enrolment.dynsec import DynsecAdmin
from control_plane.enrolment.identity import AccountsLock
from control_plane.provisioning.mosquitto import FleetAccess
from control_plane.settings import ControlPlaneSettings
from control_plane.settings.enrolment import AccountsKind

log = logging.getLogger("edgefleet.control_plane.enrolment")
TRAILING_RELOADS = (1, 2, 4, 8)
"""After the last change, the broker is signalled again after these many reload intervals
(cumulative: 1, 3, 7 and 15 s at 1 s), unless another change comes first."""


class BrokerAccounts(Protocol):
    async def issue(self, device_id: str, password: str | None = None) -> str:
        """Create or replace ``device_id``'s broker user with ``password`` (None: a new
        random one); return the password."""
        ...

    async def remove(self, device_id: str) -> None:
        """Delete ``device_id``'s broker user (its sessions end, or do at the reload)."""
        ...


class PasswordFileAccounts:
    """Devices enrolling at once share one write of the files and one reload
    (:class:`GroupCommit`): a reload makes Mosquitto reread every user. Each write loads,
    adds and rewrites the files under ``lock``, which holds across replicas."""

    def __init__(
        self,
        state_dir: Path,
        topics: Topics,
        *,
        max_batch: int = 1000,
        reload_interval_s: float = 1.0,
        lock: AccountsLock | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.topics = topics
        self.reload_interval_s = reload_interval_s
        self._lock = lock or AccountsLock(state_dir / "mqtt")
        self._wanted: dict[str, str] = {}
        """The password each queued device is to get, where the caller chose it."""
        self.batches: GroupCommit[str] = GroupCommit(
            self._issue_batch, max_batch=max_batch, min_interval_s=reload_interval_s
        )
        self._trailing: asyncio.Task[None] | None = None
        self.signals = 0
        """SIGHUPs sent (for tests and benchmarks)."""

    async def issue(self, device_id: str, password: str | None = None) -> str:
        if password is not None:  # the same device asking twice asks for the same one
            self._wanted[device_id] = password
        return await self.batches.submit(device_id)

    async def _issue_batch(self, device_ids: list[str]) -> dict[str, str | Exception]:
        wanted = {d: self._wanted.pop(d, None) for d in device_ids}
        async with self._lock.held():  # one writer of the files at a time, in any process
            results, pid_file = await asyncio.to_thread(self._issue, wanted)
        self._reload_again(pid_file)
        return results

    async def remove(self, device_id: str) -> None:
        async with self._lock.held():
            pid_file = await asyncio.to_thread(self._remove, device_id)
        self._reload_again(pid_file)

    def _reload_again(self, pid_file: Path | None) -> None:
        """Signal the broker again, later, while no further change comes.

        NOTE: Mosquitto (2.0, src/loop.c) reads the files when a reload begins and clears its
        reload flag when it ends, so a SIGHUP that arrives during a reload is lost. A reload
        rechecks every connected client's password: at 5,000 clients on a loaded host it takes
        seconds, longer than the one trailing signal 1 s later that was sent before, and the
        last batch's devices were refused for good (5 of 5,000 in benchmarks/fleet/enrolment.py).
        Signals spread over 15 intervals outlast such a reload."""
        if pid_file is None:
            return
        self.signals += 1
        if self._trailing is not None:
            self._trailing.cancel()
        self._trailing = asyncio.get_running_loop().create_task(self._trail(pid_file))

    async def _trail(self, pid_file: Path) -> None:
        for intervals in TRAILING_RELOADS:
            await asyncio.sleep(intervals * self.reload_interval_s)
            if reload_broker(pid_file):
                self.signals += 1

    def _remove(self, device_id: str) -> Path | None:
        access = FleetAccess(self.state_dir, self.topics)
        access.revoke_device(device_id)
        out = access.refresh_broker()
        if out is None:
            return None
        reload_broker(out / "data" / "mosquitto.pid")
        return out / "data" / "mosquitto.pid"

    def _issue(
        self, device_ids: dict[str, str | None]
    ) -> tuple[dict[str, str | Exception], Path | None]:
        access = FleetAccess(self.state_dir, self.topics)  # loaded under the lock
        results: dict[str, str | Exception] = {}
        for device_id, password in device_ids.items():
            try:
                results[device_id] = access.issue_device(device_id, password)
            except ValueError as exc:  # a bad id fails alone, not its batch
                results[device_id] = exc
        access.passwords.save()
        out = access.refresh_broker()
        if out is None:
            return results, None
        reload_broker(out / "data" / "mosquitto.pid")
        return results, out / "data" / "mosquitto.pid"


def reload_broker(pid_file: Path) -> bool:
    """SIGHUP the broker whose pid ``pid_file`` holds, so it rereads its password file and ACL;
    False (logged) when it cannot be: the device then connects once the operator reloads it."""
    try:
        os.kill(int(pid_file.read_text().strip()), signal.SIGHUP)
    except (OSError, ValueError) as exc:
        log.warning(
            "could not reload the broker: reload it so that enrolled devices may connect",
            extra={"pid_file": str(pid_file), "error": str(exc)},
        )
        return False
    return True


def make_accounts(
    kind: AccountsKind, settings: ControlPlaneSettings, engine: AsyncEngine | None = None
) -> BrokerAccounts:
    """``engine``: the database the replicas share, whose advisory lock makes one writer of
    the accounts among them (PostgreSQL; else a file lock, for one host)."""
    lock = AccountsLock(settings.state_dir / "mqtt", engine)
    if kind is AccountsKind.DYNSEC:
        return DynsecAdmin(settings, lock=lock)
    return PasswordFileAccounts(
        settings.state_dir,
        Topics(settings.topic_prefix),
        reload_interval_s=settings.enrolment.broker_reload_interval_s,
        lock=lock,
    )
