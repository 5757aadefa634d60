"""The launcher's journal as the agent reports it in its birth message
(:class:`common.protocol.messages.LauncherReport`): which release runs, whether a crash loop
is going on and its last error, and how the last release on trial ended.

The launcher hands its agent the journal's path (``EDGEFLEET_AGENT_FLEET__LAUNCHER_JOURNAL_FILE``);
the fleet client reads it for each status and looks at its stat on each telemetry round, so a
commit or a rollback that lands while the agent runs reaches the fleet within a round.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from agent.launcher.journal import Journal, JournalError, load_journal
from common.protocol.messages import (
    AgentPhase,
    AgentReleaseOutcome,
    AgentUpdate,
    LauncherReport,
)

log = logging.getLogger("edgefleet.agent")


def report_of(journal: Journal) -> LauncherReport:
    degraded = journal.exits_in_a_row > 0
    outcome = journal.last_outcome
    update = None
    if outcome is not None:
        update = AgentUpdate(
            version=outcome.version,
            outcome=AgentReleaseOutcome(outcome.outcome.value),
            reason=outcome.reason[:500] if outcome.reason else None,
            at=outcome.at,
        )
    return LauncherReport(
        release=journal.current,
        phase=AgentPhase.DEGRADED if degraded else AgentPhase.RUNNING,
        last_error=journal.last_error[:500] if degraded and journal.last_error else None,
        exits_in_a_row=journal.exits_in_a_row,
        last_update=update,
    )


class LauncherView:
    """The journal of the launcher above this agent, or nothing when there is none."""

    def __init__(self, journal_file: Path | None) -> None:
        self.path = journal_file
        self._seen: tuple[int, int] | None = None

    def _stat(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def changed(self) -> bool:
        """Whether the journal was written since the last :meth:`report`."""
        return self.path is not None and self._stat() != self._seen

    def report(self) -> LauncherReport | None:
        if self.path is None:
            return None
        self._seen = self._stat()
        try:
            return report_of(load_journal(self.path)) if self._seen else None
        except JournalError as exc:  # reported without it rather than not at all
            log.warning("launcher journal unreadable", extra={"error": str(exc)})
            return None
