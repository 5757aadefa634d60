"""Applying a verified manifest: download, verify, stage, switch, watch, commit or roll back.

    received -> downloading -> verified -> staged -> active -> committed
                                                          \\-> rolled_back (health window failed)
    any step  -> rejected (reason)              the previous version keeps serving throughout
    verified  -> (queued again at activate_after, its maintenance window) -> staged ...

The previous version stays loaded and warm during the health window, so switching back is one
assignment. Only the commit rewrites the on-disk pointer (``config.toml``); a crash before it
leaves the previous version served after restart, and the retained desired state brings the
update back to be tried again. A failure after the switch and before the commit is recorded
(a full disk refusing ``config.toml`` or ``fleet-state.json``) switches back the same way.

:meth:`Updater.apply` takes these arrows as named steps: ``_received`` (a copy, an older
sequence or an expired window stops here), ``_download`` (downloading -> verified, or queued
again for the maintenance window), ``_stage`` (staged, or a shadow stage), the switch, then
``_watch`` (active -> committed or rolled_back, judged by an
:class:`~agent.fleet.health.HealthWindow`); ``_refused`` is the way to rejected, or back to
downloading for a retry. How each end is written down is :class:`~agent.fleet.outcome.Settlement`'s.

A desired state that no longer lists a manifest withdraws it: dropped if it has not been
switched to yet (queued, waiting for a retry, or still downloading), reported as rejected,
superseded. One already active finishes its health window: by then it serves, and what decides
is the window, as for any other update.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
from pydantic import ValidationError

from agent.errors import LoadError
from agent.fleet.download import stage_update
from agent.fleet.health import HealthWindow
from agent.fleet.outcome import Announcer, Report, Reporter, Settlement
from agent.fleet.settings import FleetSettings
from agent.fleet.shadow import ShadowStages
from agent.fleet.stagers import BatchStager, GenerativeStager, Staged, Stager, Stagers
from agent.fleet.state import FleetState, StateFiles
from agent.fleet.store import ModelStore
from agent.inference.manager import ModelManager
from agent.inference.versions import LoadedVersion
from common.model_config import ModelConfig
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import Command, ModelManifest, UpdateState
from common.protocol.verify import VerifiedManifest, verify_window
from runtimes.errors import RuntimeFailure, validation_message

log = logging.getLogger("edgefleet.agent.fleet")

# Failures worth a retry when the desired state comes again; the others mark the sequence failed.
TRANSIENT = frozenset({Rejection.DOWNLOAD_FAILED, Rejection.DISK_FULL})
RETRY_BASE_S = 2.0
RETRY_MAX_S = 300.0


Item = VerifiedManifest | Command


@dataclass(frozen=True)
class Switched:
    """An update past its switch: the version serving now, what served before it (still
    loaded and warm), the version's directory, and what it was staged into."""

    staged: Staged
    previous: dict[int, Staged]
    version_dir: Path
    stager: Stager


class Updater:
    def __init__(
        self,
        manager: ModelManager,
        store: ModelStore,
        files: StateFiles,
        state: FleetState,
        settings: FleetSettings,
        report: Reporter,
        on_change: Callable[[], None],
        on_done: Callable[[Item], None] = lambda item: None,
        shadows: ShadowStages | None = None,
        generative: GenerativeStager | None = None,
    ) -> None:
        """``on_done`` is called once an item is finished: a command has run, a manifest was
        applied or refused for good (not while a retry of it is scheduled). ``generative``:
        where generative versions (``genai`` artifacts) are staged; None refuses them."""
        self.manager = manager
        self.stagers = Stagers(BatchStager(manager), generative)
        """What each update is staged into: the batch models, or the generative ones."""
        self.store = store
        self.files = files
        self.state = state
        self.settings = settings
        self.report = report
        self.on_change = on_change
        self.on_done = on_done
        self.shadows = shadows
        """Where a manifest marked as a shadow stage goes once staged, instead of the switch."""
        self._queue: asyncio.Queue[Item] = asyncio.Queue()
        self._retries: dict[tuple[str, int], int] = {}
        """Attempts so far of the manifests deferred by a transient fault, by (model, sequence)."""
        self._retrying: dict[tuple[str, int], tuple[VerifiedManifest, asyncio.Task[None]]] = {}
        """Manifests waiting for their retry timer: not finished, so not reported done."""
        self._pending: dict[tuple[str, int], VerifiedManifest] = {}
        """Manifests submitted and not finished, by (model, sequence). A queued copy that is no
        longer the one here was withdrawn (or submitted again) and is skipped."""
        self._switched: set[tuple[str, int]] = set()
        """Manifests past the switch: a withdrawal no longer stops them."""
        self.busy = False
        self.settlement = Settlement(
            manager,
            store,
            files,
            state,
            settings,
            report,
            on_change,
            self._retry_later,
            stagers=self.stagers,
        )
        """How updates end: commit, switch back, roll back (the fleet's command too)."""

    def submit(self, item: Item) -> None:
        if isinstance(item, VerifiedManifest):
            self._drop_older_retries(item.manifest)
            self._pending[_key(item)] = item
        self._queue.put_nowait(item)

    def withdraw(self, listed: Collection[tuple[str | None, int | None]]) -> None:
        """Drop the manifests not switched to yet that the desired state no longer lists
        (a rollout aborted or rolled back while they waited), and report them refused: a device
        that was away during a rollout and its rollback must not install what was undone."""
        for key, vm in list(self._pending.items()):
            if key in listed or key in self._switched:
                continue
            if any(model == key[0] and (seq or 0) > key[1] for model, seq in listed):
                continue  # replaced by a newer one, not withdrawn: dropped when that is queued
            retry = self._retrying.pop(key, None)
            if retry is not None:
                retry[1].cancel()
            m = vm.manifest
            log.info(
                "update withdrawn",
                extra={"model": m.model, "version": m.version, "sequence": m.sequence},
            )
            self.report(
                Report(
                    UpdateState.REJECTED,
                    m.model,
                    m.version,
                    m.sequence,
                    m.rollout_id,
                    Rejection.SUPERSEDED,
                    "withdrawn: the desired state no longer lists this update",
                )
            )
            # finished now, so that a desired state listing it again queues it again; a copy
            # still in the queue, or the download under way, sees it is no longer pending
            self._finished(vm)

    def _withdrawn(self, vm: VerifiedManifest) -> bool:
        return self._pending.get(_key(vm)) is not vm

    def sweep_staging(self) -> None:
        """Delete staging files that no pending manifest needs (those of superseded, withdrawn
        or failed updates); keep the others so their downloads resume."""
        keep = {
            ref.sha256
            for vm in self._pending.values()
            for ref in [*vm.variant.files, *([vm.manifest.golden] if vm.manifest.golden else [])]
        }
        try:
            self.store.sweep_staging(keep)
        except OSError:
            log.exception("cleaning the staging directory failed")

    async def run(self) -> None:
        timeout = httpx.Timeout(self.settings.download_timeout_s)
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=True) as http:
            try:
                await self._serve(http)
            finally:
                for _, task in self._retrying.values():
                    task.cancel()

    async def _serve(self, http: httpx.AsyncClient) -> None:
        while True:
            item = await self._queue.get()
            if isinstance(item, VerifiedManifest) and self._withdrawn(item):
                continue  # withdrawn while queued: reported then
            self.busy = True
            try:
                if isinstance(item, Command):
                    await self.settlement.rollback(item)
                else:
                    await self.apply(item, http)
            except Exception:
                # a fault in one update must not take the device off the fleet: the previous
                # version keeps serving and the next desired state is still acted on
                log.exception("update failed unexpectedly")
            finally:
                if isinstance(item, Command) or _key(item) not in self._retrying:
                    if not (isinstance(item, VerifiedManifest) and self._withdrawn(item)):
                        self._finished(item)
                self.busy = self._queue.qsize() > 0
                if isinstance(item, VerifiedManifest):
                    self._switched.discard(_key(item))
                    self.sweep_staging()

    def _finished(self, item: Item) -> None:
        if isinstance(item, VerifiedManifest):
            self._retries.pop(_key(item), None)
            if self._pending.get(_key(item)) is item:
                del self._pending[_key(item)]
        try:
            self.on_done(item)
        except Exception:
            # the bookkeeping of a finished update (a state file on a full disk) must not stop
            # the updater: it is what a redelivery would repeat, at worst
            log.exception("recording a finished update failed")

    # -- manifests: the states drawn in the module docstring -------------------------------

    async def apply(self, vm: VerifiedManifest, http: httpx.AsyncClient) -> None:
        """Take ``vm`` through the states drawn above: received, downloading and verified,
        staged, active (its health window), then committed or rolled back. Each step says
        what it reached, and returns what the next one needs or None where the update stops
        there (a refusal, a deferral, a shadow stage, a withdrawal)."""
        voice = Announcer(vm.manifest, self.report)
        self._drop_older_retries(vm.manifest)
        if not self._received(vm, voice):
            return
        try:
            switched = await self._to_active(vm, http, voice)
        except ProtocolError as exc:
            self._refused(vm, exc, voice)
            return
        if switched is not None:
            await self._watch(vm, switched, voice)

    def _received(self, vm: VerifiedManifest, voice: Announcer) -> bool:
        """Whether ``vm`` is still to be applied: not a copy of one applied or failed, not
        older than what was, and (a retry, or one with a maintenance window) still valid."""
        m = vm.manifest
        ms = self.state.model(m.model)
        if m.sequence in (ms.committed_sequence, ms.failed_sequence):
            return False  # a copy queued while this one was applied: already reported
        floor = ms.floor()
        if floor is not None and m.sequence < floor:  # a newer one was applied while this waited
            voice.say(
                UpdateState.REJECTED,
                Rejection.SUPERSEDED,
                f"sequence {m.sequence} is not newer than {floor}",
            )
            return False
        if (m.model, m.sequence) in self._retries or m.activate_after is not None:
            # verified on receipt, maybe long ago: a retry must not outlive the manifest
            try:
                verify_window(m, datetime.now(UTC))
            except ProtocolError as exc:
                voice.reject(exc)
                return False
        return True

    async def _to_active(
        self, vm: VerifiedManifest, http: httpx.AsyncClient, voice: Announcer
    ) -> Switched | None:
        """Downloading, verified, staged, then the switch; None where the update stops first.

        Raises:
            ProtocolError: a step refused the update (:meth:`_refused` says what follows).
        """
        version_dir = await self._download(vm, http, voice)
        if version_dir is None:
            return None
        staged = await self._stage(vm, version_dir, voice)
        if staged is None:
            return None
        voice.say(UpdateState.STAGED)
        self._switched.add(_key(vm))
        stager = self.stagers.for_format(vm.variant.format)
        previous = stager.activate(vm.manifest.model, staged)
        return Switched(staged, previous, version_dir, stager)

    async def _download(
        self, vm: VerifiedManifest, http: httpx.AsyncClient, voice: Announcer
    ) -> Path | None:
        """Downloading to verified: the version's directory, or None when the update waits
        for its maintenance window (queued again then) or was withdrawn meanwhile."""
        m = vm.manifest
        version_dir = await stage_update(
            vm,
            http,
            self.store,
            self.settings,
            functools.partial(self._served, vm),
            voice.say,
        )
        if self._withdrawn(vm):
            self.settlement.remove_unless_kept(m)
            return None  # withdrawn while it downloaded: reported then
        wait_s = (m.activate_after - datetime.now(UTC)).total_seconds() if m.activate_after else 0
        if wait_s > 0:  # downloaded ahead of its maintenance window: queued again then
            self._later(vm, wait_s)
            voice.say(UpdateState.VERIFIED, reason=f"switches at {m.activate_after}")
            return None
        voice.say(UpdateState.VERIFIED)
        return version_dir

    async def _stage(
        self, vm: VerifiedManifest, version_dir: Path, voice: Announcer
    ) -> Staged | None:
        """Verified to staged: the version loaded and warm, or None when it failed its
        self-test (rolled back), was withdrawn meanwhile, or is staged as a shadow."""
        m = vm.manifest
        stager = self.stagers.for_format(vm.variant.format)
        try:
            staged: Staged = await stager.stage(m.model, m.version, version_dir, self._config(m))
        except (LoadError, RuntimeFailure) as exc:
            if "self-test" not in str(exc):
                raise ProtocolError(Rejection.LOAD_FAILED, str(exc)) from exc
            # It loaded, then failed its self-test: dropped, the previous version serves.
            self.settlement.remove_unless_kept(m)
            self.settlement.fail_sequence(m)
            voice.say(UpdateState.ROLLED_BACK, Rejection.SELF_TEST_FAILED, str(exc))
            return None
        if self._withdrawn(vm):
            stager.discard(m.model, staged, "withdrawn")
            self.settlement.remove_unless_kept(m)
            return None  # reported when withdrawn
        if m.shadow is not None and not isinstance(staged, LoadedVersion):
            # shadows compare output tensors of a batch; a generative version is judged by its
            # token gates: refused rather than switched to without the shadow phase asked for
            stager.discard(m.model, staged, "shadow stage refused")
            raise ProtocolError(
                Rejection.LOAD_FAILED,
                "a shadow stage is for batch models; a generative version is rolled out and "
                "judged by its token-latency gates",
            )
        if m.shadow is not None and self.shadows is not None and isinstance(staged, LoadedVersion):
            # a batch model's candidate (shadows compare tensors, not text): loaded and warm
            # next to what serves, no switch
            self.shadows.start(m, staged)
            share = m.shadow.sample_share
            voice.say(UpdateState.STAGED, reason=f"shadow: {share:.0%} of requests copied to it")
            return None
        return staged

    def _refused(self, vm: VerifiedManifest, exc: ProtocolError, voice: Announcer) -> None:
        """A step before the switch refused the update: retried later if the fault passes
        (downloading, with the reason), else rejected and its sequence failed."""
        m = vm.manifest
        if self._withdrawn(vm):
            return  # its download was cut short by the withdrawal: reported then
        if exc.code in TRANSIENT:
            delay = self._retry_later(vm)
            log.warning(
                "update deferred",
                extra={
                    "model": m.model,
                    "version": m.version,
                    "code": exc.code.value,
                    "reason": exc.message,
                    "retry_in_s": delay,
                },
            )
            voice.say(
                UpdateState.DOWNLOADING, exc.code, f"{exc.message}; retrying in {delay:.0f} s"
            )
            return
        if exc.code == Rejection.LOAD_FAILED:
            self.settlement.remove_unless_kept(m)
        self.settlement.fail_sequence(m)
        voice.reject(exc)

    async def _watch(self, vm: VerifiedManifest, switched: Switched, voice: Announcer) -> None:
        """Active: the health window, then committed, or rolled back to what served before."""
        m = vm.manifest
        try:
            voice.say(UpdateState.ACTIVE, window_s=m.health.window_s)
            verdict = await self._verdict(m, switched)
            if verdict is None:
                self.settlement.commit(m, switched.previous, switched.stager)
        except Exception as exc:
            # After the switch and before the commit: what served before must serve again,
            # else the new version serves uncommitted, the previous ones stay loaded and
            # every redelivery repeats this.
            self.settlement.switch_back(
                vm, switched.previous, switched.staged, exc, switched.stager
            )
            return
        if verdict is not None:
            self.settlement.roll_back(
                m, switched.previous, switched.staged, verdict, switched.stager
            )
            return
        voice.say(UpdateState.COMMITTED)
        self.on_change()

    @staticmethod
    async def _verdict(m: ModelManifest, switched: Switched) -> str | None:
        """The health window's verdict on the switched version, then its golden sample's."""
        window = HealthWindow.opening(
            m.health,
            switched.staged.stats,
            [lv.stats for lv in switched.previous.values()],
            time.monotonic(),
        )
        verdict = await window.watch()
        if verdict is None:
            verdict = await switched.stager.self_test(
                m.health, switched.staged, switched.version_dir
            )
        return verdict

    def _served(self, vm: VerifiedManifest) -> list[int]:
        model = vm.manifest.model
        return self.stagers.for_format(vm.variant.format).served_versions(model)

    @staticmethod
    def _config(m: ModelManifest) -> ModelConfig:
        try:
            return ModelConfig.model_validate(
                {**m.config, "version_policy": {"specific": [m.version]}}
            )
        except ValidationError as exc:
            raise ProtocolError(
                Rejection.MALFORMED, f"manifest config: {validation_message(exc)}"
            ) from None

    def _retry_later(self, vm: VerifiedManifest) -> float:
        """Queue ``vm`` again after a growing delay (network and disk faults pass). It stays
        unfinished meanwhile, so a redelivered desired state does not queue a second copy."""
        key = _key(vm)
        attempt = self._retries.get(key, 0) + 1
        self._retries[key] = attempt
        delay = float(min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (attempt - 1)))
        self._later(vm, delay)
        return delay

    def _later(self, vm: VerifiedManifest, delay_s: float) -> None:
        """Queue ``vm`` again in ``delay_s`` (withdrawn or replaced meanwhile: cancelled)."""
        key = _key(vm)

        async def later() -> None:
            await asyncio.sleep(delay_s)
            del self._retrying[key]
            self._queue.put_nowait(vm)

        self._retrying[key] = (vm, asyncio.create_task(later(), name=f"retry:{key}"))

    def _drop_older_retries(self, m: ModelManifest) -> None:
        """A newer sequence for the model replaces a deferred older one: retried after the
        newer one, it could only be refused as superseded."""
        for key in [k for k in self._retrying if k[0] == m.model and k[1] < m.sequence]:
            vm, task = self._retrying.pop(key)
            task.cancel()
            log.info(
                "deferred update replaced by a newer one",
                extra={"model": m.model, "sequence": key[1], "by_sequence": m.sequence},
            )
            self._finished(vm)


def _key(vm: VerifiedManifest) -> tuple[str, int]:
    return vm.manifest.model, vm.manifest.sequence
