"""How an update ends once it serves, and what each step says: the commit, or the switch back
to what served before (:class:`Settlement`), the fleet's command to roll back to the previous
version, and the :class:`Report` of each step (:class:`Announcer`). The health window that
decides between them is :mod:`agent.fleet.health`'s.
"""

from __future__ import annotations

import contextlib
import logging
import tomllib
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from agent.errors import LoadError
from agent.fleet.settings import FleetSettings
from agent.fleet.stagers import BatchStager, Staged, Stager, Stagers
from agent.fleet.state import FleetState, StateFiles
from agent.fleet.store import ModelStore, is_disk_full
from agent.inference.manager import ModelManager
from common.model_config import CONFIG_FILE, ModelConfig
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import Command, ModelManifest, UpdateState
from common.protocol.verify import VerifiedManifest
from runtimes.errors import RuntimeFailure

log = logging.getLogger("edgefleet.agent.fleet")


@dataclass(frozen=True)
class Report:
    state: UpdateState
    model: str
    version: int | None = None
    sequence: int | None = None
    rollout_id: str | None = None
    code: str | None = None
    reason: str | None = None
    progress: float | None = None
    bytes_done: int | None = None
    bytes_total: int | None = None
    window_s: float | None = None


Reporter = Callable[[Report], None]


@dataclass(frozen=True)
class Announcer:
    """What one manifest's update says at each step, as a :class:`Report` of that manifest."""

    manifest: ModelManifest
    report: Reporter

    def say(
        self,
        state: UpdateState,
        code: str | None = None,
        reason: str | None = None,
        progress: float | None = None,
        *,
        bytes_done: int | None = None,
        bytes_total: int | None = None,
        window_s: float | None = None,
    ) -> None:
        m = self.manifest
        self.report(
            Report(
                state,
                m.model,
                m.version,
                m.sequence,
                m.rollout_id,
                code,
                reason,
                progress,
                bytes_done,
                bytes_total,
                window_s,
            )
        )

    def reject(self, exc: ProtocolError) -> None:
        m = self.manifest
        log.warning(
            "update rejected",
            extra={
                "model": m.model,
                "version": m.version,
                "code": exc.code.value,
                "reason": exc.message,
            },
        )
        self.say(UpdateState.REJECTED, exc.code, exc.message)


class Settlement:
    """How an update ends, for the updater that owns it: commit, switch back, roll back, and
    what each leaves on disk and in ``fleet-state.json``. ``defer`` queues a manifest again
    later and returns the delay (the updater's retry). ``stagers``: where a model's versions
    are staged (by default the batch models' manager only); each end takes the stager its
    update was staged into."""

    def __init__(
        self,
        manager: ModelManager,
        store: ModelStore,
        files: StateFiles,
        state: FleetState,
        settings: FleetSettings,
        report: Reporter,
        on_change: Callable[[], None],
        defer: Callable[[VerifiedManifest], float],
        *,
        stagers: Stagers | None = None,
    ) -> None:
        self.manager = manager
        self.stagers = stagers or Stagers(BatchStager(manager), None)
        self.store = store
        self.files = files
        self.state = state
        self.settings = settings
        self.report = report
        self.on_change = on_change
        self.defer = defer

    def fail_sequence(self, m: ModelManifest) -> None:
        """Record ``m``'s sequence as failed: a retained desired state does not retry it."""
        self.state.model(m.model).failed_sequence = m.sequence
        self.files.save_state(self.state)

    def remove_unless_kept(self, m: ModelManifest) -> None:
        """A version that did not become the committed one is not left to be served later."""
        ms = self.state.model(m.model)
        served = self.stagers.for_model(m.model).served_versions(m.model)
        if m.version != ms.committed_version and m.version not in served:
            self.store.remove_version(m.model, m.version)

    def roll_back(
        self,
        m: ModelManifest,
        previous: dict[int, Staged],
        staged: Staged,
        verdict: str,
        stager: Stager | None = None,
    ) -> None:
        """The health window failed: what served before serves again, the sequence failed."""
        (stager or self.stagers.batch).restore(m.model, previous, staged, verdict)
        self.fail_sequence(m)
        if m.version not in previous:
            self.remove_unless_kept(m)
        log.warning(
            "update rolled back",
            extra={"model": m.model, "version": m.version, "reason": verdict},
        )
        Announcer(m, self.report).say(
            UpdateState.ROLLED_BACK, Rejection.HEALTH_CHECK_FAILED, verdict
        )
        self.on_change()

    def switch_back(
        self,
        vm: VerifiedManifest,
        previous: dict[int, Staged],
        staged: Staged,
        exc: Exception,
        stager: Stager | None = None,
    ) -> None:
        """Undo a switch that could not be committed. A storage fault (a full disk, an I/O
        error) is retried later, as storage faults before the switch are; anything else marks
        the sequence failed."""
        m = vm.manifest
        reason = f"could not be committed: {type(exc).__name__}: {exc}"
        (stager or self.stagers.batch).restore(m.model, previous, staged, reason)
        self.on_change()
        if m.version not in previous:
            self.remove_unless_kept(m)
        if isinstance(exc, OSError):
            code = Rejection.DISK_FULL if is_disk_full(exc) else Rejection.DOWNLOAD_FAILED
            delay = self.defer(vm)
            log.warning(
                "update switched back, deferred",
                extra={"model": m.model, "version": m.version, "reason": reason},
            )
            # not a final state: the control plane shows the reason while the device retries
            state, reason = UpdateState.DOWNLOADING, f"{reason}; retrying in {delay:.0f} s"
        else:
            log.exception("update switched back", extra={"model": m.model, "version": m.version})
            code, state = Rejection.LOAD_FAILED, UpdateState.ROLLED_BACK
            self.state.model(m.model).failed_sequence = m.sequence
            with contextlib.suppress(OSError):  # best effort: the fault may be the disk's
                self.files.save_state(self.state)
        self.report(Report(state, m.model, m.version, m.sequence, m.rollout_id, code, reason))

    def commit(
        self, m: ModelManifest, previous: dict[int, Staged], stager: Stager | None = None
    ) -> None:
        """Raises OSError where the disk refuses the pointer or the state, with both put back
        as far as the disk allows (``ModelStore.recover`` reconciles what it did not)."""
        ms = self.state.model(m.model)
        before_state = ms.model_copy()
        undo = self.store.commit(m.model, m.version, m.config)  # what a restart serves
        before = (
            ms.committed_version
            if ms.committed_version is not None
            else max(previous, default=None)
        )
        if before != m.version:
            ms.previous_version, ms.previous_sequence = before, ms.committed_sequence
        ms.committed_version, ms.committed_sequence = m.version, m.sequence
        ms.restored_sequence = None
        try:
            self.files.save_state(self.state)
        except BaseException:
            self.state.models[m.model] = before_state
            with contextlib.suppress(OSError):
                undo()
            raise
        # Committed from here on: what follows is cleanup, and its failure undoes nothing.
        try:
            (stager or self.stagers.batch).settle(m.model, previous)
            keep = {m.version} | (
                {ms.previous_version} if ms.previous_version is not None else set()
            )
            keep = set(sorted(keep)[-self.settings.keep_versions :]) | {m.version}
            self.store.prune(m.model, keep)
        except Exception:
            log.exception("cleaning up after a commit failed", extra={"model": m.model})

    # -- commands -------------------------------------------------------------------------

    async def rollback(self, command: Command) -> None:
        """Switch a model back to the version committed before the current one."""
        ms = self.state.model(command.model)
        target = ms.previous_version
        version_dir = self.store.version_dir(command.model, target) if target is not None else None

        def say(state: UpdateState, code: str, reason: str) -> None:
            self.report(
                Report(state, command.model, target, ms.committed_sequence, None, code, reason)
            )

        if command.from_version is not None and ms.committed_version != command.from_version:
            say(
                UpdateState.REJECTED,
                Rejection.NOTHING_TO_ROLL_BACK,
                f"{command.model} runs version {ms.committed_version}, not {command.from_version}",
            )
            return
        if target is None or version_dir is None or not version_dir.is_dir():
            say(
                UpdateState.REJECTED,
                Rejection.NOTHING_TO_ROLL_BACK,
                f"no previous version of {command.model} is kept on this device",
            )
            return
        config_path = self.store.repository / command.model / CONFIG_FILE
        raw = tomllib.loads(config_path.read_text()) if config_path.is_file() else {}
        raw["version_policy"] = {"specific": [target]}
        stager = self.stagers.for_model(command.model)
        try:
            staged = await stager.stage(
                command.model, target, version_dir, ModelConfig.model_validate(raw)
            )
        except (LoadError, RuntimeFailure, ValidationError) as exc:
            say(
                UpdateState.REJECTED,
                Rejection.LOAD_FAILED,
                f"previous version {target} does not load: {exc}",
            )
            return
        previous = stager.activate(command.model, staged)
        self.store.commit(
            command.model, target, {k: v for k, v in raw.items() if k != "version_policy"}
        )
        ms.committed_version, ms.previous_version = target, None
        ms.restored_sequence, ms.previous_sequence = ms.previous_sequence, None
        self.files.save_state(self.state)
        stager.settle(command.model, previous)
        say(
            UpdateState.ROLLED_BACK,
            Rejection.FLEET_COMMAND,
            command.reason or "rollback requested by the fleet",
        )
        self.on_change()
