"""An agent release from the fleet (an ``agent_release`` manifest in the desired state), handed
to the launcher this agent runs under.

    received --verified (signature, window, target, anti-rollback)--> downloading
      --artifact by digest--> install_verified (verifies again, installs, pending.json)
      --SIGHUP to the launcher--> the launcher stops this agent and puts the release on trial

The launcher's journal (agent/launcher/journal.py) says what was done already, so a desired
state delivered again (a reconnect, the new agent's own start) does nothing twice: the release
running or on trial is left alone, one installed already (the previous one, restored by a
fleet rollback) is asked for again without a download, and one that failed its trial here is
not retried (``edgefleet launcher retry`` on the device, or a newer release, is the way on).
Refusals are reported as update events of ``@agent`` with their code; an agent not under a
launcher refuses every release (``no_launcher``). Commits and rollbacks reach the fleet in the
launcher report of the agent's status, not as events: the agent that reports them is the new
one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from agent.fleet.download import fetch
from agent.fleet.outcome import Report
from agent.fleet.settings import FleetSettings
from agent.launcher.journal import (
    Journal,
    JournalError,
    PendingRelease,
    load_journal,
    save_pending,
)
from agent.launcher.releases import Releases
from agent.launcher.verified import install_verified, load_floor
from common.protocol.agent_release import AgentReleaseManifest, verify_agent_release
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import UpdateState
from common.protocol.signing import TrustRoot
from common.protocol.verify import DeviceIdentity

log = logging.getLogger("edgefleet.agent.fleet")

AGENT_KEY = "@agent"
"""What the update events of an agent release name as their model (no model is so called)."""
QUEUE_SIZE = 8


def is_agent_release(raw: Any) -> bool:
    signed = raw.get("signed") if isinstance(raw, dict) else None
    return isinstance(signed, dict) and signed.get("kind") == "agent_release"


class AgentReleases:
    """Agent releases from the desired state, one at a time, in a task of the fleet client."""

    def __init__(
        self,
        settings: FleetSettings,
        identity: DeviceIdentity,
        trust: Callable[[], TrustRoot],
        report: Callable[[Report], None],
    ) -> None:
        journal = settings.launcher_journal_file
        self.root: Path | None = journal.parent if journal is not None else None
        self.settings = settings
        self.identity = identity
        self._trust = trust
        self._report = report
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_SIZE)
        self._offered: set[tuple[object, object]] = set()
        """(version, sequence) offered in this process: a redelivery is ignored."""

    def offer(self, raw: dict[str, Any]) -> None:
        """An agent-release envelope from the desired state (handled by :meth:`run`)."""
        signed = raw["signed"]
        key = (signed.get("version"), signed.get("sequence"))
        if key in self._offered:
            return
        self._offered.add(key)
        try:
            self._queue.put_nowait(raw)
        except asyncio.QueueFull:  # a flood of distinct releases: the next delivery retries
            self._offered.discard(key)
            log.warning("agent release dropped: too many waiting", extra={"version": key[0]})

    @property
    def downloads(self) -> Path | None:
        """Where a release's artifact is downloaded to (an offline bundle's goes there too)."""
        return self.root / "downloads" if self.root is not None else None

    def check(self, raw: dict[str, Any], now: datetime) -> AgentReleaseManifest:
        """A bundle's release checked as :meth:`run` checks it before its download (which
        checks it again, with the cases of a release installed or failed here).

        Raises:
            ProtocolError: ``no_launcher``, or what :func:`verify_agent_release` raises.
        """
        if self.root is None:
            signed = raw.get("signed") or {}
            raise ProtocolError(
                Rejection.NO_LAUNCHER,
                "this agent does not run under the launcher (edgefleet launcher run), so it "
                "cannot update itself",
                model=AGENT_KEY,
                sequence=signed.get("sequence") if isinstance(signed, dict) else None,
            )
        floor = load_floor(self.root)
        return verify_agent_release(raw, self._trust(), self.identity, floor, now).manifest

    async def run(self) -> None:
        timeout = httpx.Timeout(self.settings.download_timeout_s)
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=True) as http:
            while True:
                raw = await self._queue.get()
                signed = raw["signed"]
                try:
                    await self._apply(http, raw)
                except ProtocolError as exc:
                    self._refused(signed, exc.code, exc.message)
                except Exception as exc:  # one release's bug, not the fleet client's end
                    log.exception("agent release failed")
                    self._refused(signed, Rejection.MALFORMED, f"{type(exc).__name__}: {exc}")

    async def _apply(self, http: httpx.AsyncClient, raw: dict[str, Any]) -> None:
        if self.root is None:
            raise ProtocolError(
                Rejection.NO_LAUNCHER,
                "this agent does not run under the launcher (edgefleet launcher run), so it "
                "cannot update itself",
            )
        root, now = self.root, datetime.now(UTC)
        journal = _journal(root)
        signed = raw["signed"]
        version = signed.get("version")
        if version == journal.current or (journal.trial and journal.trial.version == version):
            return  # running, or on trial: this agent may be that very release
        if isinstance(version, str) and version in journal.failed:
            last = journal.last_outcome
            if last is not None and last.version == version:
                return  # its trial just failed: the launcher report in the status says why
            raise ProtocolError(
                Rejection.REPLAYED,
                f"agent release {version} is not retried: it failed its trial here "
                f"({journal.failed[version]}); `edgefleet launcher retry {version}` on the "
                "device, or a newer release",
            )
        releases = Releases(root / "releases")
        if isinstance(version, str) and releases.installed(version):
            # installed and verified before (the release a fleet rollback goes back to): its
            # signature, window and target checked again, not its sequence, which is behind
            verified = verify_agent_release(raw, self._trust(), self.identity, None, now)
            self._progress(verified.manifest, UpdateState.RECEIVED)
            save_pending(root, PendingRelease(version=verified.manifest.version))
            self._wake_launcher(verified.manifest.version)
            return
        floor = load_floor(root)
        manifest = verify_agent_release(raw, self._trust(), self.identity, floor, now).manifest
        self._progress(manifest, UpdateState.DOWNLOADING)
        staging = root / "downloads"
        staging.mkdir(parents=True, exist_ok=True)
        artifact = await fetch(
            http,
            manifest.artifact,
            staging,
            max_bytes=self.settings.max_artifact_bytes,
            attempts=self.settings.download_attempts,
        )
        trust = self._trust()
        await asyncio.to_thread(
            install_verified, raw, artifact, trust, self.identity, root, datetime.now(UTC)
        )
        artifact.unlink(missing_ok=True)
        self._progress(manifest, UpdateState.STAGED)
        self._wake_launcher(manifest.version)

    def _wake_launcher(self, version: str) -> None:
        """SIGHUP to the launcher above this agent: it takes ``pending.json`` and stops this
        agent to start the release on trial."""
        parent = os.getppid()
        pid = _journal(self.root).launcher_pid if self.root else None
        if pid != parent:  # not our launcher: it takes pending.json when it starts
            log.warning(
                "launcher not this agent's parent: the release waits for its next start",
                extra={"version": version, "launcher_pid": pid, "parent": parent},
            )
            return
        log.info(
            "agent release installed: asking the launcher for its trial", extra={"version": version}
        )
        os.kill(parent, signal.SIGHUP)

    def _progress(self, manifest: AgentReleaseManifest, state: UpdateState) -> None:
        self._report(Report(state, AGENT_KEY, None, manifest.sequence, manifest.rollout_id))

    def _refused(self, signed: dict[str, Any], code: Rejection, message: str) -> None:
        log.warning(
            "agent release refused",
            extra={"version": signed.get("version"), "code": code.value, "reason": message},
        )
        sequence = signed.get("sequence")
        rollout_id = signed.get("rollout_id")
        self._report(
            Report(
                UpdateState.REJECTED,
                AGENT_KEY,
                None,
                sequence if type(sequence) is int else None,
                rollout_id if isinstance(rollout_id, str) else None,
                code.value,
                message,
            )
        )


def _journal(root: Path) -> Journal:
    try:
        return load_journal(root / "launcher.json")
    except JournalError as exc:
        raise ProtocolError(Rejection.MALFORMED, f"the launcher's journal: {exc}") from exc
