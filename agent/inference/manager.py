"""Model lifecycle: load, warm, switch atomically, drain and close; the memory budget.

A model serves the versions its version policy selects. ``load(model)`` re-reads the model's
directory and config, loads and warms what is new, then swaps the served set in one
assignment, so new requests see either the old set or the new one. Versions that drop out
finish the requests already routed to them before they are closed. If anything new fails to
load or warm, the served set is left as it was and the failure is recorded and raised. Any
error while loading a version (a bug too) leaves that version UNAVAILABLE with the reason, and
the start-up load goes on to the next model.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import (
    AgentError,
    LoadError,
    MemoryBudgetError,
    ModelNotFoundError,
    ModelNotReadyError,
)
from agent.inference.loader import VersionLoader
from agent.inference.pipelined import PipelineVersion, model_caller
from agent.inference.priority import lower_this_thread
from agent.inference.shadow import ShadowTaps
from agent.inference.tuning import same_config
from agent.inference.versions import LoadedVersion, RuntimeFactory, VersionState, VersionStatus
from agent.pipelines.pipeline import ModelCall
from agent.pipelines.settings import PipelineSettings
from common.model_config import ModelConfig, ModelConfigError, load_model_config, version_dirs
from runtimes.backends import open_model
from runtimes.formats import is_generative
from runtimes.hardware.context import HardwareContext
from runtimes.hardware.heap import limit_heaps
from runtimes.settings import RuntimeSettings

if TYPE_CHECKING:
    from agent.metrics import AgentMetrics

log = logging.getLogger("edgefleet.agent.models")


@dataclass
class ModelEntry:
    name: str
    config: ModelConfig = field(default_factory=ModelConfig)
    served: dict[int, LoadedVersion] = field(default_factory=dict)
    """Versions taking requests; replaced as a whole on every switch (``ModelManager._serve``)."""
    status: dict[int, VersionStatus] = field(default_factory=dict)
    error: str = ""
    """Why the model as a whole cannot load (bad config, no versions)."""
    from_repository: bool = False
    """Loaded from the repository (the start-up load, the repository API): it counts for the
    server's readiness. A model new to the device that the fleet stages does not until a load
    from the repository (the next start): its installs are the fleet's to judge and roll back."""

    @property
    def default_version(self) -> LoadedVersion | None:
        return self.served[max(self.served)] if self.served else None


class ModelManager:
    def __init__(
        self,
        repository: Path,
        hardware: HardwareContext,
        runtime_settings: RuntimeSettings,
        *,
        cpu_count: int,
        metrics: AgentMetrics | None = None,
        runtime_factory: RuntimeFactory = open_model,
        pipelines: PipelineSettings | None = None,
    ) -> None:
        self.repository = repository
        limit_heaps()  # before the threads that load and run models allocate (trim_heap)
        self.pipelines = pipelines or PipelineSettings()
        """Settings of the models' pipelines (image limits, timeouts, Python steps)."""
        self.step_executor = ThreadPoolExecutor(
            max_workers=self.pipelines.step_threads or os.cpu_count() or 1,
            thread_name_prefix="pipeline-step",
            # they compute, as the inference threads do: below the event loop's priority
            initializer=lower_this_thread,
            initargs=(runtime_settings.compute_nice_offset,),
        )
        """Runs pipelines' built-in steps (image decoding, normalising, top-k)."""
        self.hardware = hardware
        self.runtime_settings = runtime_settings
        self.cpu_count = cpu_count
        # a cgroup quota or cpuset below the processors: the runtimes must not size their
        # thread pools by the processors they see (runtimes.hardware.cgroup)
        self.cpus_limited = hardware.facts.usable_cpus < hardware.facts.cpu_count
        self.models: dict[str, ModelEntry] = {}
        self._load_lock = asyncio.Lock()  # loads are rare; one at a time keeps memory honest
        self._retiring: set[asyncio.Task[None]] = set()
        self.metrics = metrics
        self.runtime_factory = runtime_factory
        self._departure_watchers: list[Callable[[LoadedVersion], None]] = []
        self.shadows = ShadowTaps()
        """Candidates staged as shadows of a serving version (the fleet client adds them)."""
        self.loader = VersionLoader(
            hardware,
            runtime_settings,
            cpu_count=cpu_count,
            cpus_limited=self.cpus_limited,
            runtime_factory=runtime_factory,
            pipelines=self.pipelines,
            step_executor=self.step_executor,
            make_room=self._make_room,
            caller_for=lambda lv: self.model_caller(lv, 1, None),
            metrics=metrics,
        )
        """Loads and warms versions; the manager switches to them."""

    # -- queries --------------------------------------------------------------------------

    def resolve(self, model: str, version: str | None = None) -> LoadedVersion:
        """The version that answers a request: the one named, or the newest served."""
        entry = self.models.get(model)
        if entry is None:
            raise ModelNotFoundError(f"unknown model {model!r}", field="model_name")
        if version is None or version == "":
            found = entry.default_version
            if found is None:
                raise ModelNotReadyError(f"model {model!r} has no ready version" + _why(entry))
            return found
        if not (version.isascii() and version.isdigit()):  # '²'.isdigit(), yet int() fails
            raise ModelNotFoundError(
                f"model {model!r} has no version {version!r}", field="model_version"
            )
        number = int(version)
        if number in entry.served:
            return entry.served[number]
        status = entry.status.get(number)
        if status is None:
            raise ModelNotFoundError(
                f"model {model!r} has no version {version}", field="model_version"
            )
        reason = f": {status.reason}" if status.reason else ""
        raise ModelNotReadyError(
            f"model {model!r} version {version} is {status.state.value}{reason}"
        )

    def ready(self, *, strict: bool = True) -> bool:
        """Whether the models let the server be ready. Triton's rule, over the models loaded
        from the repository (one unloaded on purpose is gone): with ``strict`` every one of them
        serves (none failed or still loading), without it at least one model serves. With no
        such model it is yes in both modes, as Triton's for an empty repository: nothing is
        left to wait for."""
        counted = [e for e in self.models.values() if e.from_repository]
        if not counted:
            return True
        if strict:
            return all(e.served for e in counted)
        return any(e.served for e in self.models.values())

    def used_memory_bytes(self) -> int:
        return sum(v.memory_bytes for e in self.models.values() for v in e.served.values())

    def index(self) -> list[dict[str, str]]:
        """Every model in the repository and every version known, with state and reason."""
        rows = []
        names = set(self.models) | set(self._repository_models())
        for name in sorted(names):
            entry = self.models.get(name)
            if entry is None:
                rows.append(
                    {"name": name, "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}
                )
                continue
            if not entry.status:
                rows.append(
                    {"name": name, "version": "", "state": "UNAVAILABLE", "reason": entry.error}
                )
            for version, status in sorted(entry.status.items()):
                rows.append(
                    {
                        "name": name,
                        "version": str(version),
                        "state": status.state.value,
                        "reason": status.reason,
                    }
                )
        return rows

    def _repository_models(self) -> list[str]:
        if not self.repository.is_dir():
            return []
        # generative models are the token loop's (agent/generative), not the batcher's
        return sorted(
            p.name
            for p in self.repository.iterdir()
            if p.is_dir() and not p.name.startswith(".") and not is_generative(p)
        )

    # -- lifecycle ------------------------------------------------------------------------

    def watch_departures(self, callback: Callable[[LoadedVersion], None]) -> None:
        """Call ``callback`` with every version at the switch that takes it out of service:
        replaced, switched out (standby), rolled back, unloaded or evicted. Requests already
        routed to it still finish there; :attr:`LoadedVersion.closed` says when no more can.
        Telemetry uses it to report each version's last window."""
        self._departure_watchers.append(callback)

    def _serve(
        self, entry: ModelEntry, served: dict[int, LoadedVersion]
    ) -> dict[int, LoadedVersion]:
        """Switch ``entry`` to ``served`` in one assignment and tell the watchers which
        versions left; return what served before."""
        old, entry.served = entry.served, served
        for lv in old.values():
            if not any(lv is s for s in served.values()):
                for watcher in self._departure_watchers:
                    watcher(lv)
        return old

    async def load_all(self) -> None:
        """Load every model of the repository; failures are recorded, the rest serve."""
        for name in self._repository_models():
            try:
                await self.load(name)
            except AgentError as exc:  # LoadError, MemoryBudgetError, ModelNotFoundError
                log.error("model failed to load", extra={"model": name, "reason": str(exc)})
            except Exception:
                # a bug of ours: one model must not stop the start-up load of the others
                log.exception("model failed to load", extra={"model": name})

    async def load(self, model: str) -> ModelEntry:
        """(Re)load ``model`` from the repository and switch to what its policy selects."""
        async with self._load_lock:
            return await self._load(model)

    async def _load(self, model: str) -> ModelEntry:
        model_dir = self.repository / model
        if not model_dir.is_dir() or model.startswith(".") or "/" in model:
            raise ModelNotFoundError(f"no model {model!r} in the repository {self.repository}")
        entry = self.models.setdefault(model, ModelEntry(model))
        entry.from_repository = True  # a failure to load counts against readiness too
        try:
            config = load_model_config(model_dir)
            versions = {int(p.name): p for p in version_dirs(model_dir)}
        except (ModelConfigError, OSError) as exc:
            entry.error = str(exc)
            raise LoadError(f"model {model!r}: {exc}") from exc
        wanted = config.version_policy.select(list(versions))
        if not wanted:
            entry.error = f"no version directory of {model_dir} matches the version policy"
            raise LoadError(f"model {model!r}: {entry.error}")
        entry.error = ""
        keep = {
            v: lv
            for v, lv in entry.served.items()
            if v in wanted and same_config(lv.config, config)
        }
        fresh: dict[int, LoadedVersion] = {}
        try:
            for version in wanted:
                if version not in keep:
                    fresh[version] = await self.loader.load(
                        entry, version, versions[version], config
                    )
        except Exception:  # LoadError, or MemoryBudgetError for a version after the first
            for lv in fresh.values():  # all or nothing: drop what this attempt loaded
                if lv.version in entry.served:
                    entry.status[lv.version] = VersionStatus(VersionState.READY)
                else:
                    entry.status.pop(lv.version, None)
                await lv.batcher.close()
            raise
        old = self._serve(entry, {**keep, **fresh})  # the switch: one assignment
        entry.config = config
        for version in fresh:
            entry.status[version] = VersionStatus(VersionState.READY)
        for version, lv in old.items():
            if entry.served.get(version) is not lv:
                self._retire(entry, lv)
        return entry

    def _retire(self, entry: ModelEntry, lv: LoadedVersion, *, keep_status: bool = False) -> None:
        if entry.served.get(lv.version) is None and not keep_status:
            entry.status[lv.version] = VersionStatus(VersionState.UNLOADING)

        async def retire() -> None:
            await lv.retire()
            if lv.version not in entry.served and not keep_status:
                entry.status.pop(lv.version, None)
            log.info("version closed", extra={"model": entry.name, "version": lv.version})

        task = asyncio.create_task(retire(), name=f"retire:{entry.name}:{lv.version}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    # -- staged switches (the fleet client) ---------------------------------------------------

    async def stage(
        self, model: str, version: int, version_dir: Path, config: ModelConfig
    ) -> LoadedVersion:
        """Load and warm a version without serving it.

        Raises:
            LoadError: it does not load, or fails its warm-up self-test.
        """
        async with self._load_lock:
            entry = self.models.setdefault(model, ModelEntry(model))
            # the updater stages only what a verified manifest delivered
            lv = await self.loader.load(entry, version, version_dir, config, verified=True)
            if version not in entry.served:
                entry.status[version] = VersionStatus(VersionState.STAGED)
            return lv

    def activate(self, model: str, staged: LoadedVersion) -> dict[int, LoadedVersion]:
        """Serve only ``staged``, in one assignment; return what served before, still loaded
        and warm, for :meth:`settle` (commit) or :meth:`restore` (roll back)."""
        entry = self.models.setdefault(model, ModelEntry(model))
        previous = self._serve(entry, {staged.version: staged})
        entry.config = staged.config
        entry.status[staged.version] = VersionStatus(VersionState.READY)
        for version, lv in previous.items():
            if lv is not staged and version != staged.version:
                entry.status[version] = VersionStatus(VersionState.STANDBY)
        return previous

    def restore(
        self, model: str, previous: dict[int, LoadedVersion], failed: LoadedVersion, reason: str
    ) -> None:
        """Switch back to ``previous`` and close ``failed``."""
        entry = self.models[model]
        self._serve(entry, previous)
        for version in previous:
            entry.status[version] = VersionStatus(VersionState.READY)
        if failed.version not in previous:
            entry.status[failed.version] = VersionStatus(VersionState.UNAVAILABLE, reason)
        self._retire(entry, failed, keep_status=True)

    def settle(self, model: str, previous: dict[int, LoadedVersion]) -> None:
        """Commit: close the versions that served before the switch."""
        entry = self.models[model]
        for lv in previous.values():
            if entry.served.get(lv.version) is not lv:
                self._retire(entry, lv)

    def discard(self, model: str, staged: LoadedVersion, reason: str) -> None:
        """Close a staged version that will not be switched to."""
        entry = self.models[model]
        if staged.version not in entry.served:
            entry.status[staged.version] = VersionStatus(VersionState.UNAVAILABLE, reason)
        self._retire(entry, staged, keep_status=True)

    async def unload(self, model: str) -> None:
        async with self._load_lock:
            entry = self.models.get(model)
            if entry is None:
                raise ModelNotFoundError(f"model {model!r} is not loaded")
            await self._unload(entry)

    async def _unload(self, entry: ModelEntry) -> None:
        old = self._serve(entry, {})
        for lv in old.values():
            self._retire(entry, lv)
        del self.models[entry.name]
        await asyncio.gather(*self._retiring, return_exceptions=True)

    async def close(self) -> None:
        """Drain and close every version (after the server stopped taking requests)."""
        for entry in list(self.models.values()):
            old = self._serve(entry, {})
            for lv in old.values():
                self._retire(entry, lv)
        await asyncio.gather(*self._retiring, return_exceptions=True)
        self.step_executor.shutdown(wait=False, cancel_futures=True)

    async def _make_room(self, model: str, needed: int, name: str) -> None:
        """Evict idle evictable models, least recently used first, until ``needed`` bytes fit
        the profile's memory budget.

        Raises:
            MemoryBudgetError: they do not, even with every such model evicted.
        """
        budget = self.hardware.memory_budget_bytes
        if budget is None or self.used_memory_bytes() + needed <= budget:
            return
        victims = sorted(
            (
                e
                for e in self.models.values()
                if e.name != model
                and e.config.evictable
                and e.served
                and all(v.idle for v in e.served.values())
            ),
            key=lambda e: max(v.last_used for v in e.served.values()),
        )
        for entry in victims:
            log.warning("evicting idle model for memory", extra={"model": entry.name, "for": name})
            await self._unload(entry)
            if self.used_memory_bytes() + needed <= budget:
                return
        in_use = (
            ", ".join(
                f"{e.name} {sum(v.memory_bytes for v in e.served.values()) / 2**20:.0f} MiB"
                for e in self.models.values()
                if e.served
            )
            or "nothing"
        )
        raise MemoryBudgetError(
            f"loading {name} needs about {needed / 2**20:.0f} MiB but the memory budget of profile "
            f"{self.hardware.profile.name} is {budget / 2**20:.0f} MiB with "
            f"{self.used_memory_bytes() / 2**20:.0f} MiB in use ({in_use}); mark idle models "
            "evictable or raise the budget"
        )

    # -- pipelines ------------------------------------------------------------------------

    def model_caller(
        self, lv: PipelineVersion, priority: int, timeout_s: float | None
    ) -> ModelCall:
        """How ``lv``'s pipeline calls models (:func:`agent.inference.pipelined.model_caller`)."""
        return model_caller(lv, self.resolve, self.metrics, priority, timeout_s)


def _why(entry: ModelEntry) -> str:
    reasons = [s.reason for s in entry.status.values() if s.reason] or (
        [entry.error] if entry.error else []
    )
    return f" ({reasons[-1]})" if reasons else ""
