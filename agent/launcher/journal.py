"""The launcher's journal, ``launcher.json``: which release is current, which is kept to go
back to, the trial in progress, and the releases that failed theirs.

One file, written whole (scratch file, fsync, rename, fsync of the directory) before the
launcher acts on it, so a kill -9 leaves either the state before a step or the state after
it, never a mix of the pointers and the trial. Only the launcher process writes it; the
``edgefleet launcher`` commands ask for a change through ``pending.json``
(:class:`PendingRelease`) and a SIGHUP.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.files import write_atomically
from common.protocol.agent_release import AGENT_VERSION_PATTERN

BASE = "base"
"""The agent installed beside the launcher (the .deb's or the wheel's): what runs before any
release came from the fleet, and the last place to go back to."""

VERSION_PATTERN = re.compile(AGENT_VERSION_PATTERN)
"""A release version is also a directory name: no separators, no leading dot."""


class JournalError(Exception):
    """The journal (or a pending request) cannot be read; the message names the file."""


class Phase(StrEnum):
    """What the launcher is doing, as ``launcher status`` and the agent's status show it."""

    STARTING = "starting"
    """The agent was started and has not sent READY=1 yet."""
    TRIAL = "trial"
    """A new release runs on trial: it must get ready within the deadline and stay up."""
    RUNNING = "running"
    """The current release sent READY=1 and runs."""
    DEGRADED = "degraded"
    """The agent exited: the launcher waits (backing off) and starts it again, and stays in
    this phase until it is ready."""
    STOPPED = "stopped"
    """The launcher was asked to stop and has stopped the agent."""


class Outcome(StrEnum):
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"


class Trial(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str
    previous: str
    """What ``current`` was before the flip: where a failed trial goes back to."""
    launches: int = 0
    """Launches begun, counted before each start: one the launcher never saw end counts."""
    last_error: str | None = None


class ReleaseOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str
    outcome: Outcome
    reason: str | None = None
    at: datetime


class Journal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    current: str = BASE
    previous: str | None = None
    trial: Trial | None = None
    failed: dict[str, str] = Field(default_factory=dict)
    """Releases whose trial failed, with the reason: not tried again unless an operator asks
    (``edgefleet launcher retry VERSION``)."""
    last_outcome: ReleaseOutcome | None = None
    phase: Phase = Phase.STARTING
    last_error: str | None = None
    """Why the agent last exited or failed, until it is up again."""
    exits_in_a_row: int = 0
    launcher_pid: int | None = None
    """The launcher's process, for the commands' SIGHUP."""

    def settle(self, outcome: Outcome, reason: str | None = None) -> None:
        """End the trial: commit it, or go back to the release it replaced."""
        assert self.trial is not None
        trial = self.trial
        if outcome is Outcome.COMMITTED:
            self.previous = trial.previous
        else:
            self.current = trial.previous
            self.failed[trial.version] = reason or "failed its trial"
        self.trial = None
        self.last_outcome = ReleaseOutcome(
            version=trial.version, outcome=outcome, reason=reason, at=datetime.now(UTC)
        )


class PendingRelease(BaseModel):
    """A request to put an installed release on trial (``pending.json``)."""

    model_config = ConfigDict(extra="forbid")

    version: str
    retry: bool = False
    """Try it even if it failed a trial before (the operator asked)."""


def _read(path: Path, cls: type[BaseModel]) -> BaseModel | None:
    if not path.is_file():
        return None
    try:
        return cls.model_validate_json(path.read_bytes())
    except (ValidationError, OSError) as exc:
        raise JournalError(f"{path}: {exc}") from exc


def load_journal(path: Path) -> Journal:
    found = _read(path, Journal)
    return found if isinstance(found, Journal) else Journal()


def save_journal(path: Path, journal: Journal) -> None:
    write_atomically(path, journal.model_dump_json(indent=2).encode())


def pending_path(root: Path) -> Path:
    return root / "pending.json"


def load_pending(root: Path) -> PendingRelease | None:
    found = _read(pending_path(root), PendingRelease)
    return found if isinstance(found, PendingRelease) else None


def save_pending(root: Path, request: PendingRelease) -> None:
    write_atomically(pending_path(root), request.model_dump_json().encode())
