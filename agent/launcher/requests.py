"""What the launcher does with ``pending.json`` (a release put on trial) and on start after a
kill -9: each step is one journal write, so finishing or undoing it is reading the journal.

=================  ==================================  ===================================
killed after       journal on the next start           what the launcher does
=================  ==================================  ===================================
unpacking          unchanged (a staging folder left)   removes the staging folder, runs
                                                       ``current``; ``pending.json``, if
                                                       written, starts the trial now
the flip           ``current`` = new, ``trial`` set    goes on with the trial (pending
                                                       removed), counting the launch
a trial launch     ``trial.launches`` counted          launches again, or after
                                                       ``trial_max_launches`` goes back
the commit         ``current`` = new, no trial         runs the new release
=================  ==================================  ===================================
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from agent.launcher.journal import (
    BASE,
    Journal,
    Outcome,
    ReleaseOutcome,
    Trial,
    load_pending,
    pending_path,
)
from agent.launcher.releases import Releases

log = logging.getLogger("edgefleet.launcher")


def recover(journal: Journal, releases: Releases) -> None:
    """Repair what a kill -9 or a removed folder left, before anything starts."""
    for name in releases.clean_staging():
        log.warning("removed an interrupted install", extra={"folder": name})
    if journal.trial is not None:
        log.warning(
            "resuming a trial",
            extra={"version": journal.trial.version, "launches": journal.trial.launches},
        )
    if not releases.installed(journal.current):
        gone = journal.current
        previous = journal.previous
        journal.current = previous if previous and releases.installed(previous) else BASE
        journal.trial = None
        journal.last_error = f"release {gone} is not installed; running {journal.current}"
        log.error("current release missing", extra={"version": gone, "now": journal.current})


def take_pending(journal: Journal, releases: Releases) -> bool:
    """Flip to the pending release, if one is asked for and may run; True if the journal
    changed (the caller saves it, then :func:`drop_pending`)."""
    pending = load_pending(releases.dir.parent)
    if pending is None:
        return False
    version = pending.version
    if journal.trial is not None:
        if journal.trial.version == version:
            drop_pending(releases)  # flipped already: killed before pending.json went
        return False  # another one waits for the trial in progress to end
    if version == journal.current:
        drop_pending(releases)  # it runs already
        return False
    refusal = None
    if not releases.installed(version):
        refusal = f"release {version} is not installed"
    elif version in journal.failed and not pending.retry:
        refusal = f"not retried: it failed its trial ({journal.failed[version]})"
    if refusal is not None:
        log.error("pending release refused", extra={"version": version, "reason": refusal})
        journal.last_outcome = ReleaseOutcome(
            version=version,
            outcome=Outcome.ROLLED_BACK,
            reason=refusal,
            at=datetime.now(UTC),
        )
        return True
    journal.failed.pop(version, None)
    journal.trial = Trial(version=version, previous=journal.current)
    journal.current = version
    journal.exits_in_a_row = 0
    log.info("release on trial", extra={"version": version, "previous": journal.trial.previous})
    return True


def drop_pending(releases: Releases) -> None:
    pending_path(releases.dir.parent).unlink(missing_ok=True)
