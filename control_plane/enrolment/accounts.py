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

from common.protocol.topics import Topics
from control_plane.enrolment.batching import GroupCommit
from control_plane.enrolment.dynsec import DynsecAdmin
from control_plane.enrolment.settings import AccountsKind
from control_plane.provisioning.mosquitto import FleetAccess
from control_plane.settings import ControlPlaneSettings

log = logging.getLogger("edgefleet.control_plane.enrolment")
RELOAD_SETTLE_S = 1.0
"""After a change, the broker is signalled once more when none came for this long."""


class BrokerAccounts(Protocol):
    async def issue(self, device_id: str) -> str:
        """Create or replace ``device_id``'s broker user; return its new password."""
        ...

    async def remove(self, device_id: str) -> None:
        """Delete ``device_id``'s broker user (its sessions end, or do at the reload)."""
        ...


class PasswordFileAccounts:
    """Devices enrolling at once share one write of the files and one reload
    (:class:`GroupCommit`): a reload makes Mosquitto reread every user."""

    def __init__(self, state_dir: Path, topics: Topics, *, max_batch: int = 1000) -> None:
        self.state_dir = state_dir
        self.topics = topics
        self._lock = asyncio.Lock()
        self.batches: GroupCommit[str] = GroupCommit(self._issue_batch, max_batch=max_batch)
        self._trailing: asyncio.TimerHandle | None = None

    async def issue(self, device_id: str) -> str:
        return await self.batches.submit(device_id)

    async def _issue_batch(self, device_ids: list[str]) -> dict[str, str | Exception]:
        async with self._lock:  # one writer of the files at a time
            results, pid_file = await asyncio.to_thread(self._issue, device_ids)
        self._reload_again(pid_file)
        return results

    async def remove(self, device_id: str) -> None:
        async with self._lock:
            pid_file = await asyncio.to_thread(self._remove, device_id)
        self._reload_again(pid_file)

    def _reload_again(self, pid_file: Path | None) -> None:
        """Signal the broker once more when the changes have settled.

        NOTE: Mosquitto (2.0, src/loop.c) clears its reload flag after reloading, so a SIGHUP
        that arrives while it reloads is lost; with batches back to back, the last one's was,
        and its devices were refused until the next change (benchmarks/fleet/enrolment.py)."""
        if pid_file is None:
            return
        if self._trailing is not None:
            self._trailing.cancel()
        loop = asyncio.get_running_loop()
        self._trailing = loop.call_later(RELOAD_SETTLE_S, reload_broker, pid_file)

    def _remove(self, device_id: str) -> Path | None:
        access = FleetAccess(self.state_dir, self.topics)
        access.revoke_device(device_id)
        out = access.refresh_broker()
        if out is None:
            return None
        reload_broker(out / "data" / "mosquitto.pid")
        return out / "data" / "mosquitto.pid"

    def _issue(self, device_ids: list[str]) -> tuple[dict[str, str | Exception], Path | None]:
        access = FleetAccess(self.state_dir, self.topics)
        results: dict[str, str | Exception] = {}
        for device_id in device_ids:
            try:
                results[device_id] = access.issue_device(device_id)
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


def make_accounts(kind: AccountsKind, settings: ControlPlaneSettings) -> BrokerAccounts:
    if kind is AccountsKind.DYNSEC:
        return DynsecAdmin(settings)
    return PasswordFileAccounts(settings.state_dir, Topics(settings.topic_prefix))
