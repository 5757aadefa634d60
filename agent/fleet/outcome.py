"""How an update ends once it serves: its health window, then the commit, or the switch
back to what served before; and the fleet's command to roll back to the previous version.
Each step is reported as a :class:`Report`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from agent.errors import AgentError, LoadError
from agent.fleet.settings import FleetSettings
from agent.fleet.state import FleetState, StateFiles
from agent.fleet.store import ModelStore, is_disk_full
from agent.inference.manager import ModelManager
from agent.inference.versions import LoadedVersion
from common.model_config import CONFIG_FILE, ModelConfig
from common.protocol.errors import Rejection
from common.protocol.messages import Command, HealthCriteria, ModelManifest, UpdateState
from common.protocol.verify import VerifiedManifest
from runtimes.errors import RuntimeFailure
from runtimes.golden import GOLDEN_FILE, GoldenSample

log = logging.getLogger("edgefleet.agent.fleet")

BASELINE_S = 300.0
"""How far back the previous version's latency is read for the p99 comparison."""


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


class UpdateOutcome:
    """The closing steps of :class:`agent.fleet.updater.Updater`: what they read and write is
    the updater's own state, set up in its ``__init__``."""

    manager: ModelManager
    store: ModelStore
    files: StateFiles
    state: FleetState
    settings: FleetSettings
    report: Reporter
    on_change: Callable[[], None]

    if TYPE_CHECKING:

        def _retry_later(self, vm: VerifiedManifest) -> float: ...

    def _switch_back(
        self,
        vm: VerifiedManifest,
        previous: dict[int, LoadedVersion],
        staged: LoadedVersion,
        exc: Exception,
    ) -> None:
        """Undo a switch that could not be committed. A storage fault (a full disk, an I/O
        error) is retried later, as storage faults before the switch are; anything else marks
        the sequence failed."""
        m = vm.manifest
        reason = f"could not be committed: {type(exc).__name__}: {exc}"
        self.manager.restore(m.model, previous, staged, reason)
        self.on_change()
        if m.version not in previous:
            self._remove_unless_kept(m)
        if isinstance(exc, OSError):
            code = Rejection.DISK_FULL if is_disk_full(exc) else Rejection.DOWNLOAD_FAILED
            delay = self._retry_later(vm)
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

    def _remove_unless_kept(self, m: ModelManifest) -> None:
        """A version that did not become the committed one is not left to be served later."""
        ms = self.state.model(m.model)
        entry = self.manager.models.get(m.model)
        if m.version != ms.committed_version and not (entry and m.version in entry.served):
            self.store.remove_version(m.model, m.version)

    async def _health_window(
        self,
        criteria: HealthCriteria,
        staged: LoadedVersion,
        previous: dict[int, LoadedVersion],
        version_dir: Path,
    ) -> str | None:
        """None if the new version passed its window, else why not. Fails early once the
        error budget of the window is spent."""
        started = time.monotonic()
        baseline: float | None = None
        for lv in previous.values():
            if len(lv.stats.recent) >= max(criteria.min_requests, 1):
                p99 = lv.stats.latency_percentiles(started - BASELINE_S, (99,))
                baseline = p99[0] if p99 else None
        stats = staged.stats
        deadline = started + criteria.window_s
        while True:
            requests = stats.success.count + stats.fail.count
            errors = stats.model_errors()
            if (
                requests >= criteria.min_requests
                and requests
                and errors / requests > criteria.max_error_rate
            ):
                return (
                    f"error rate {errors / requests:.1%} over {requests} requests exceeds "
                    f"{criteria.max_error_rate:.1%}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            stats.failed.clear()
            # woken by a failure to re-check the error budget, else at the window's end
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await stats.failed.wait()
        requests = stats.success.count + stats.fail.count
        if baseline and requests >= criteria.min_requests:
            new_p99 = (stats.latency_percentiles(started, (99,)) or [0.0])[0]
            ratio = new_p99 / baseline
            if ratio > criteria.max_p99_ratio:
                return (
                    f"p99 latency {new_p99 * 1000:.1f} ms is {ratio:.2f}x the previous version's "
                    f"{baseline * 1000:.1f} ms (limit {criteria.max_p99_ratio}x)"
                )
        golden_path = version_dir / GOLDEN_FILE
        if criteria.self_test and golden_path.is_file():
            golden = GoldenSample.load(golden_path)
            rows = staged.signature.validate_inputs(golden.inputs) or 1
            try:
                result = await staged.batcher.infer(golden.inputs, rows, priority=1, timeout_s=None)
            except (AgentError, RuntimeFailure) as exc:
                return f"self-test after the window failed: {exc}"
            problems = golden.mismatches(result.outputs)
            if problems:
                return "self-test after the window failed: " + "; ".join(problems)
        return None

    def _commit(self, m: ModelManifest, previous: dict[int, LoadedVersion]) -> None:
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
        ms.previous_version = before if before != m.version else ms.previous_version
        ms.committed_version, ms.committed_sequence = m.version, m.sequence
        try:
            self.files.save_state(self.state)
        except BaseException:
            self.state.models[m.model] = before_state
            with contextlib.suppress(OSError):
                undo()
            raise
        # Committed from here on: what follows is cleanup, and its failure undoes nothing.
        try:
            self.manager.settle(m.model, previous)
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
        try:
            staged = await self.manager.stage(
                command.model, target, version_dir, ModelConfig.model_validate(raw)
            )
        except (LoadError, RuntimeFailure, ValidationError) as exc:
            say(
                UpdateState.REJECTED,
                Rejection.LOAD_FAILED,
                f"previous version {target} does not load: {exc}",
            )
            return
        previous = self.manager.activate(command.model, staged)
        self.store.commit(
            command.model, target, {k: v for k, v in raw.items() if k != "version_policy"}
        )
        ms.committed_version, ms.previous_version = target, None
        self.files.save_state(self.state)
        self.manager.settle(command.model, previous)
        say(
            UpdateState.ROLLED_BACK,
            Rejection.FLEET_COMMAND,
            command.reason or "rollback requested by the fleet",
        )
        self.on_change()
