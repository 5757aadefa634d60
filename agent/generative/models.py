"""Generative models of the repository: loaded where the hardware profile places them, warmed
before they serve, hot-swapped without dropping streams in flight.

A generative model is a model directory like any other (``DIR/<model>/<version>/``) whose
version holds ``genai_config.json`` (:func:`runtimes.formats.is_generative`); the newest
version serves. :meth:`GenerativeModels.load` loads and warms the newest version, switches new
requests to it in one assignment, then lets the old version's sequences finish before its
engine and session close (in-flight streams finish on the old version). Where the model's
``config.toml`` has a version policy (the fleet writes one at each commit), the newest version
it selects serves instead.

The fleet's updater takes the same steps one at a time, as it does with batch models
(:class:`agent.fleet.stagers.GenerativeStager`): :meth:`~GenerativeModels.stage` loads and
warms a version without serving it, :meth:`~GenerativeModels.activate` switches to it,
:meth:`~GenerativeModels.restore` switches back, :meth:`~GenerativeModels.settle` retires what
served before, and :meth:`~GenerativeModels.discard` drops a staged version.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent.errors import AgentError, LoadError, ModelNotFoundError, ModelNotReadyError
from agent.generative.decoder import Decoder, DecoderShape
from agent.generative.engine import Engine
from agent.generative.metrics import GenerativeMetrics, SequenceTimer
from agent.generative.scheduler import Scheduler
from agent.generative.settings import GenerativeSettings
from agent.generative.text import TextCodec
from agent.inference.priority import run_lowered
from agent.inference.stats import VersionStats
from agent.inference.versions import RuntimeFactory
from common.model_config import ModelConfigError, load_model_config, version_dirs
from runtimes.base import Placement
from runtimes.errors import DeviceUnavailableError
from runtimes.formats import GENAI_CONFIG, ModelFormat, is_generative
from runtimes.hardware.context import HardwareContext
from runtimes.settings import RuntimeSettings

log = logging.getLogger("edgefleet.agent.generative")

KV_MEMORY_SHARE = 0.25
"""Of the profile's memory budget, what the default KV budget may take."""


@dataclass(eq=False)
class GenerativeVersion:
    model: str
    version: int
    placement: Placement
    engine: Engine
    load_s: float
    created: int = 0
    """When it started serving, as a Unix time (OpenAI's ``created`` of a model)."""
    stats: VersionStats = field(default_factory=VersionStats)
    """How its sequences ended (the fleet's health window reads it)."""

    def card(self) -> dict[str, object]:
        """The model as OpenAI's model object describes one (``GET /v1/models``), plus its
        version and context window."""
        return {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "edgefleet",
            "version": str(self.version),
            "context_length": self.context_length,
        }

    @property
    def context_length(self) -> int:
        """The longest prompt + completion a request may ask for."""
        return min(self.engine.context_length, self.engine.scheduler.kv_budget_tokens)


class GenerativeModels:
    """The generative models served, by name."""

    def __init__(
        self,
        repository: Path,
        hardware: HardwareContext,
        runtime_settings: RuntimeSettings,
        settings: GenerativeSettings,
        *,
        registry: CollectorRegistry,
        runtime_factory: RuntimeFactory,
    ) -> None:
        self.repository = repository
        self.hardware = hardware
        self.runtime_settings = runtime_settings
        self.settings = settings
        self.runtime_factory = runtime_factory
        self.served: dict[str, GenerativeVersion] = {}
        self.errors: dict[str, str] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()  # one load at a time: two versions in memory at most
        self.metrics = GenerativeMetrics(registry, self._engines)

    def names(self) -> list[str]:
        if not self.repository.is_dir():
            return []
        return sorted(
            p.name
            for p in self.repository.iterdir()
            if p.is_dir() and not p.name.startswith(".") and is_generative(p)
        )

    def resolve(self, model: str) -> GenerativeVersion:
        """Raises:
        ModelNotFoundError: no such generative model (``model``).
        ModelNotReadyError: known, but not loaded (the reason given)."""
        found = self.served.get(model)
        if found is not None:
            return found
        if model in self.errors:
            raise ModelNotReadyError(f"model {model!r} is not ready: {self.errors[model]}")
        raise ModelNotFoundError(f"the model {model!r} does not exist", field="model")

    def index(self) -> list[dict[str, str]]:
        """Rows of the repository index (``/v2/repository/index``), as the batch models'."""
        rows = []
        for name in self.names():
            served = self.served.get(name)
            if served is not None:
                rows.append(
                    {"name": name, "version": str(served.version), "state": "READY", "reason": ""}
                )
            else:
                reason = self.errors.get(name, "loading")
                rows.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": reason})
        return rows

    def ready(self) -> bool:
        return all(name in self.served for name in self.names())

    async def load_all(self) -> None:
        for name in self.names():
            try:
                await self.load(name)
            except AgentError as exc:
                log.error(
                    "generative model failed to load", extra={"model": name, "reason": str(exc)}
                )

    async def load(self, model: str) -> GenerativeVersion:
        """Load the newest version of ``model``, warm it, switch to it, retire the old one.

        Raises:
            LoadError: no version, or it failed to load or warm (the old one keeps serving).
        """
        async with self._lock:
            return await self._load(model)

    async def _load(self, model: str) -> GenerativeVersion:
        version_dir = self._chosen(model)
        number = int(version_dir.name)
        current = self.served.get(model)
        if current is not None and current.version == number:
            return current
        try:
            loaded = await self._staged(model, number, version_dir)
        except AgentError as exc:
            self.errors[model] = str(exc)
            raise
        self.settle(model, self.activate(model, loaded))
        return loaded

    def _chosen(self, model: str) -> Path:
        """The version directory to serve: the newest that its version policy selects.

        Raises:
            LoadError: none holds genai_config.json, or the model's config.toml is invalid.
        """
        model_dir = self.repository / model
        versions = {int(v.name): v for v in version_dirs(model_dir) if (v / GENAI_CONFIG).is_file()}
        try:
            wanted = load_model_config(model_dir).version_policy.select(list(versions))
        except ModelConfigError as exc:
            self.errors[model] = str(exc)
            raise LoadError(f"model {model!r}: {exc}") from exc
        if not wanted:
            self.errors[model] = "no version holds genai_config.json"
            raise LoadError(f"model {model!r}: {self.errors[model]}")
        return versions[wanted[-1]]

    # -- staged switches (the fleet's updater) --------------------------------------------

    async def stage(self, model: str, version: int, version_dir: Path) -> GenerativeVersion:
        """Load and warm ``version_dir`` as ``version`` of ``model``, without serving it.

        Raises:
            LoadError: it does not load or warm (what serves is untouched).
        """
        async with self._lock:
            return await self._staged(model, version, version_dir)

    async def _staged(self, model: str, version: int, version_dir: Path) -> GenerativeVersion:
        started = time.monotonic()
        loaded = await self._open(model, version, version_dir)
        loaded.load_s = time.monotonic() - started
        return loaded

    def activate(self, model: str, staged: GenerativeVersion) -> dict[int, GenerativeVersion]:
        """Serve ``staged`` from now on, in one assignment; return what served before (still
        loaded and warm, its streams going on) for :meth:`settle` or :meth:`restore`."""
        current = self.served.get(model)
        staged.created = int(time.time())  # a timestamp for clients, not an interval
        self.served[model] = staged  # new requests go here from now on
        self.errors.pop(model, None)
        log.info(
            "generative model serving",
            extra={
                "model": model,
                "version": staged.version,
                "placement": staged.placement.describe(),
            },
        )
        return {} if current is None or current is staged else {current.version: current}

    def restore(
        self,
        model: str,
        previous: dict[int, GenerativeVersion],
        failed: GenerativeVersion,
        reason: str,
    ) -> None:
        """Switch back to what ``previous`` holds (with nothing, the model stops serving, for
        ``reason``) and retire ``failed`` once its streams end."""
        before = max(previous.values(), key=lambda v: v.version, default=None)
        if before is None:
            self.served.pop(model, None)
            self.errors[model] = reason
        else:
            self.served[model] = before
        if self.served.get(model) is not failed:
            self._retire_later(failed)

    def settle(self, model: str, previous: dict[int, GenerativeVersion]) -> None:
        """Retire the versions that served before a switch, once their streams end."""
        for old in previous.values():
            if self.served.get(model) is not old:
                self._retire_later(old)

    def discard(self, model: str, staged: GenerativeVersion, reason: str) -> None:
        """Close a staged version that will not serve (``reason`` is logged)."""
        if self.served.get(model) is not staged:
            log.info(
                "generative version discarded",
                extra={"model": model, "version": staged.version, "reason": reason},
            )
            self._retire_later(staged)

    def served_versions(self, model: str) -> list[int]:
        served = self.served.get(model)
        return [served.version] if served is not None else []

    def _retire_later(self, old: GenerativeVersion) -> None:
        task = asyncio.create_task(self._retire(old), name=f"retire-{old.model}-{old.version}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _open(self, model: str, number: int, version_dir: Path) -> GenerativeVersion:
        shape = DecoderShape.read(version_dir)
        failed: dict[str, str] = {}
        while True:  # the profile's candidates in order, as the batch loader tries them
            try:
                placement = self._placement(model, failed)
                decoder, codec = await run_lowered(
                    self.runtime_settings.compute_nice_offset,
                    f"load-{model}",
                    functools.partial(self._build, version_dir, shape, placement),
                )
                break
            except DeviceUnavailableError as exc:
                log.warning(
                    "generative model: device unavailable, trying the next candidate",
                    extra={"model": model, "placement": placement.describe(), "reason": str(exc)},
                )
                failed[placement.describe()] = str(exc)
            except AgentError:
                raise
            except Exception as exc:  # the runtime's errors: the version does not serve
                raise LoadError(f"model {model!r} version {number}: {exc}") from exc
        s = self.settings
        scheduler = Scheduler(
            slots=s.max_sequences,
            kv_budget_tokens=self._kv_budget(decoder),
            max_waiting=s.max_waiting_sequences,
            prefill_chunk_tokens=s.prefill_chunk_tokens,
            prefill_chunks_per_step=s.prefill_chunks_per_step,
        )
        series, stats = self.metrics.series(model, str(number)), VersionStats()
        engine = Engine(
            decoder,
            codec,
            scheduler,
            timer=lambda n: SequenceTimer(series, stats, time.monotonic(), n),
            nice_offset=self.runtime_settings.compute_nice_offset,
        )
        engine.start(f"{model}-{number}")
        return GenerativeVersion(model, number, placement, engine, 0.0, stats=stats)

    def _placement(self, model: str, failed: dict[str, str]) -> Placement:
        """The profile's first ONNX Runtime candidate that can run here (with its execution
        provider); OpenVINO's candidates for ONNX files are passed over, with the reason.

        Raises:
            NoPlacementError: none is left.
        """
        while True:
            placement = self.hardware.plan(model, ModelFormat.ONNX, failed=failed).placement
            if placement.runtime == "onnxruntime":
                return placement
            failed[placement.describe()] = "the token loop runs on ONNX Runtime"

    def _build(
        self, version_dir: Path, shape: DecoderShape, placement: Placement
    ) -> tuple[Decoder, TextCodec]:
        """Open the runtime, the cache and the tokenizer, and warm them (in a load thread)."""
        runtime = self.runtime_factory(
            version_dir / shape.filename, placement, self.runtime_settings
        )
        decoder = Decoder(runtime, shape, self.settings.max_sequences)
        try:
            codec = TextCodec(version_dir)
            warm_up(decoder, self.settings.prefill_chunk_tokens)
        except BaseException:
            decoder.close()
            raise
        return decoder, codec

    def _kv_budget(self, decoder: Decoder) -> int:
        full = self.settings.max_sequences * decoder.shape.context
        if self.settings.kv_cache_tokens is not None:
            return self.settings.kv_cache_tokens
        budget = self.hardware.memory_budget_bytes
        if budget is None:
            return full
        fits = int(budget * KV_MEMORY_SHARE) // decoder.bytes_per_token
        return max(decoder.shape.context, min(full, fits))

    async def _retire(self, old: GenerativeVersion) -> None:
        await old.engine.drain()
        await old.engine.close()
        log.info("generative version retired", extra={"model": old.model, "version": old.version})

    def _engines(self) -> Iterator[tuple[str, str, Engine]]:
        for name, served in sorted(self.served.items()):
            yield name, str(served.version), served.engine

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        served, self.served = self.served, {}
        for version in served.values():
            await version.engine.close()


def warm_up(decoder: Decoder, chunk_tokens: int) -> None:
    """Run both calls the engine makes once at their usual largest: a full prefill chunk, and
    a decode step of every slot at the shortest past window. The runtime grows its memory
    arena for them here, not under the first requests: on the benchmark model the first
    decode of 8 rows took 425 ms (23 ms after), and 16 rows 766 ms, when only one row had
    run before."""
    chunk = max(1, min(chunk_tokens, decoder.shape.context - 1))
    logits = decoder.prefill(0, [0] * chunk, 0)
    token = int(logits.argmax())
    decoder.decode([(slot, token, chunk) for slot in range(decoder.slots)])
