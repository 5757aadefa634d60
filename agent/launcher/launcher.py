"""The launcher's loop: start the current release, watch it, and on trial commit it or go
back to the one it replaced; restart an agent that exits, backing off, and never give up.

::

    start ──> STARTING ──READY=1──> RUNNING ──exit──> DEGRADED ──back-off──> start
      │                                                  ^
      └─ on trial ─> TRIAL ──READY=1 within ready_timeout_s, then up trial_window_s──> commit
                       │
                       └─ exit, or no READY=1 in time ──> launches < max? back-off, again
                                                         : back to ``previous`` (rolled_back)

Every change is written to the journal before the launcher acts on it (agent/launcher/
requests.py has what a kill -9 at each step leaves).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

from agent.launcher.child import Child, Signals, Wake
from agent.launcher.journal import Journal, Outcome, Phase, load_journal, save_journal
from agent.launcher.notify import NotifySocket, Upstream
from agent.launcher.releases import ReleaseError, Releases
from agent.launcher.requests import drop_pending, recover, take_pending
from agent.launcher.settings import LauncherSettings

log = logging.getLogger("edgefleet.launcher")


@dataclass
class RunEnd:
    """How one run of the agent ended: ``reason`` None means it was asked to stop."""

    reason: str | None
    stop: bool = False
    """The launcher itself was asked to stop (SIGTERM, SIGINT)."""


class Launcher:
    def __init__(
        self, settings: LauncherSettings, environ: Mapping[str, str], upstream: Upstream
    ) -> None:
        self.settings = settings
        self.environ = dict(environ)
        self.upstream = upstream
        self.releases = Releases(settings.releases_dir)
        self.journal = Journal()

    def save(self) -> None:
        save_journal(self.settings.journal_file, self.journal)

    def run(self) -> int:
        """Run until SIGTERM or SIGINT; the exit status."""
        self.settings.root_dir.mkdir(parents=True, exist_ok=True)
        self.journal = load_journal(self.settings.journal_file)
        recover(self.journal, self.releases)
        self.journal.launcher_pid = os.getpid()
        self.journal.phase = Phase.STARTING  # what a killed launcher's agent did is over
        self.save()
        notify = NotifySocket(self.settings.root_dir / "notify.sock")
        signals = Signals()
        try:
            while True:
                self._flip_to_pending()
                end = self._launch(notify, signals)
                if end.stop:
                    break
                if end.reason is not None and not self._failed(end.reason, signals):
                    break
        finally:
            signals.close()
            notify.close()
        self.journal.phase = Phase.STOPPED
        self.save()
        log.info("launcher stopped", extra={"current": self.journal.current})
        return 0

    def _flip_to_pending(self) -> None:
        if take_pending(self.journal, self.releases):
            self.save()  # the flip: current = new, trial set, in one write
            drop_pending(self.releases)

    def _launch(self, notify: NotifySocket, signals: Signals) -> RunEnd:
        journal = self.journal
        trial = journal.trial
        if trial is not None and trial.launches >= self.settings.trial_max_launches:
            # every launch allowed was begun and none ended in an outcome: the launcher was
            # killed during each (or the machine lost power), which counts against the release
            reason = trial.last_error or f"no outcome in {trial.launches} launches"
            self._roll_back(reason)
            trial = None
        if trial is not None:
            trial.launches += 1  # counted before the start: a kill -9 now counts too
        version = journal.current
        # a crash loop shows as degraded until the agent is ready again, not as a new start
        journal.phase = (
            Phase.TRIAL if trial else Phase.DEGRADED if journal.exits_in_a_row else Phase.STARTING
        )
        self.save()
        try:
            argv, paths = self.releases.command(version, self.settings.agent_args)
            child = Child(
                argv,
                self._child_env(notify, paths),
                notify,
                signals,
                self.upstream,
                self.settings.child_watchdog_s,
            )
        except (ReleaseError, OSError) as exc:
            return RunEnd(f"cannot start: {exc}")
        log.info(
            "agent started",
            extra={"version": version, "pid": child.pid, "trial": trial is not None},
        )
        self.upstream.send(f"STATUS=starting agent {version}" + (" on trial" if trial else ""))
        try:
            return self._watch(child, signals)
        finally:
            child.stop(self.settings.stop_grace_s)

    def _watch(self, child: Child, signals: Signals) -> RunEnd:
        s, journal = self.settings, self.journal
        wake = child.wait(child.started + s.ready_timeout_s if journal.trial else None)
        while wake is Wake.SIGNAL:
            if (end := self._signalled(signals)) is not None:
                return end
            wake = child.wait(child.started + s.ready_timeout_s if journal.trial else None)
        if wake is Wake.EXITED:
            return RunEnd(f"crashed before ready (exit {child.returncode}): {child.last_line()}")
        if wake is Wake.TIMEOUT:
            return RunEnd(f"not ready within {s.ready_timeout_s:g} s")
        ready_at = time.monotonic()
        journal.phase = Phase.TRIAL if journal.trial else Phase.RUNNING
        self.save()
        self.upstream.ready(f"agent {journal.current} {journal.phase}")
        log.info("agent ready", extra={"version": journal.current, "phase": journal.phase})
        if journal.trial is not None:
            end = self._wait_up(child, signals, ready_at + s.trial_window_s)
            if end is not None:
                if end.reason is not None:
                    end.reason = end.reason.replace("after ready", "during the trial window")
                return end
            self._commit()
        end = self._wait_up(child, signals, ready_at + s.stable_after_s)
        if end is not None:
            return end
        if journal.exits_in_a_row or journal.last_error:
            journal.exits_in_a_row, journal.last_error = 0, None
            self.save()  # up long enough: a crash loop, if any, has ended
        return self._wait_up(child, signals, None) or RunEnd("watch ended")

    def _wait_up(self, child: Child, signals: Signals, until: float | None) -> RunEnd | None:
        """Wait while the ready agent runs; None once ``until`` passes with it up."""
        while True:
            wake = child.wait(until)
            if wake is Wake.TIMEOUT:
                return None
            if wake is Wake.EXITED:
                return RunEnd(f"exited {child.returncode} after ready: {child.last_line()}")
            if wake is Wake.SILENT:
                return RunEnd(f"watchdog pings stopped for {self.settings.child_watchdog_s:g} s")
            if wake is Wake.SIGNAL and (end := self._signalled(signals)) is not None:
                return end

    def _signalled(self, signals: Signals) -> RunEnd | None:
        received = signals.take()
        if signal.SIGTERM in received or signal.SIGINT in received:
            log.info("launcher asked to stop")
            self.upstream.send("STOPPING=1", "STATUS=shutting down")
            return RunEnd(None, stop=True)
        if take_pending(self.journal, self.releases):
            self.save()
            drop_pending(self.releases)
            if self.journal.trial is not None:
                return RunEnd(None)  # switch: the next launch is the new release's trial
        return None

    def _commit(self) -> None:
        assert self.journal.trial is not None
        version = self.journal.trial.version
        self.journal.settle(Outcome.COMMITTED)
        self.journal.phase = Phase.RUNNING
        self.save()
        log.info("release committed", extra={"version": version})

    def _roll_back(self, reason: str) -> None:
        assert self.journal.trial is not None
        version = self.journal.trial.version
        self.journal.settle(Outcome.ROLLED_BACK, reason)
        self.journal.exits_in_a_row = 0
        self.save()
        log.error("release rolled back", extra={"version": version, "reason": reason})

    def _failed(self, reason: str, signals: Signals) -> bool:
        """Record a failed run, go back on a failed trial, back off; False to stop."""
        journal = self.journal
        journal.last_error = reason
        trial = journal.trial
        if trial is not None:
            trial.last_error = reason
            if trial.launches >= self.settings.trial_max_launches:
                self._roll_back(reason)
                return True  # start the previous release at once
        journal.exits_in_a_row += 1
        journal.phase = Phase.DEGRADED
        self.save()
        delay = min(
            self.settings.backoff_initial_s * 2 ** (journal.exits_in_a_row - 1),
            self.settings.backoff_max_s,
        )
        log.error(
            "agent failed",
            extra={"version": journal.current, "reason": reason, "restart_in_s": delay},
        )
        self.upstream.send(f"STATUS=degraded: {reason}"[:500])
        return self._back_off(delay, signals)

    def _back_off(self, delay_s: float, signals: Signals) -> bool:
        deadline = time.monotonic() + delay_s
        with selectors.DefaultSelector() as selector:
            selector.register(signals.reader, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                due = self.upstream.next_due()
                selector.select(min(left, max(0.0, due - time.monotonic())) if due else left)
                self.upstream.tick()
                signals.drain()
                received = signals.take()
                if signal.SIGTERM in received or signal.SIGINT in received:
                    self.upstream.send("STOPPING=1", "STATUS=shutting down")
                    return False
                if signal.SIGHUP in received:
                    return True  # a pending release, if any, is taken at once
        return True

    def _child_env(self, notify: NotifySocket, paths: list[str]) -> dict[str, str]:
        env = dict(self.environ)
        env["NOTIFY_SOCKET"] = str(notify.path)
        # the agent reports the journal to the fleet (agent/launcher/report.py)
        env["EDGEFLEET_AGENT_FLEET__LAUNCHER_JOURNAL_FILE"] = str(self.settings.journal_file)
        if self.settings.child_watchdog_s:
            env["WATCHDOG_USEC"] = str(int(self.settings.child_watchdog_s * 1e6))
        if paths:
            env["PYTHONPATH"] = ":".join([*paths, *filter(None, [env.get("PYTHONPATH")])])
        return env
