"""What the updater stages a version into: the seam between one update's states and the two
kinds of model that serve.

A :class:`Stager` loads and warms a version without serving it (``stage``), switches to it
in one assignment (``activate``, returning what served before, still warm), switches back
(``restore``), retires what served before once committed (``settle``), drops a staged version
(``discard``), and runs the version's self-test after its health window. The batch models'
:class:`~agent.inference.manager.ModelManager` is one (:class:`BatchStager`), the generative
models' :class:`~agent.generative.models.GenerativeModels` the other
(:class:`GenerativeStager`); :class:`Stagers` picks by the artifact's format, or, for a
rollback command, by what the model's directory holds. The updater's steps are the same for
both: a failed load leaves the previous version serving, a failed window switches back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent.fleet.health import self_test_verdict
from agent.inference.manager import ModelManager
from agent.inference.stats import VersionStats
from agent.inference.versions import LoadedVersion
from common.model_config import ModelConfig
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import HealthCriteria
from runtimes.formats import GENAI_FORMAT, is_generative

if TYPE_CHECKING:
    from agent.generative.models import GenerativeModels, GenerativeVersion


class Staged(Protocol):
    """A loaded version, staged or serving: what the updater reads of it."""

    @property
    def version(self) -> int: ...

    @property
    def stats(self) -> VersionStats: ...


class Stager(Protocol):
    async def stage(
        self, model: str, version: int, version_dir: Path, config: ModelConfig
    ) -> Any: ...

    def activate(self, model: str, staged: Any) -> dict[int, Any]: ...

    def restore(self, model: str, previous: dict[int, Any], failed: Any, reason: str) -> None: ...

    def settle(self, model: str, previous: dict[int, Any]) -> None: ...

    def discard(self, model: str, staged: Any, reason: str) -> None: ...

    def served_versions(self, model: str) -> list[int]: ...

    async def self_test(
        self, criteria: HealthCriteria, staged: Any, version_dir: Path
    ) -> str | None: ...


class BatchStager:
    """The batch models' manager as a :class:`Stager`."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    async def stage(
        self, model: str, version: int, version_dir: Path, config: ModelConfig
    ) -> LoadedVersion:
        return await self.manager.stage(model, version, version_dir, config)

    def activate(self, model: str, staged: Any) -> dict[int, Any]:
        return self.manager.activate(model, staged)

    def restore(self, model: str, previous: dict[int, Any], failed: Any, reason: str) -> None:
        self.manager.restore(model, previous, failed, reason)

    def settle(self, model: str, previous: dict[int, Any]) -> None:
        self.manager.settle(model, previous)

    def discard(self, model: str, staged: Any, reason: str) -> None:
        self.manager.discard(model, staged, reason)

    def served_versions(self, model: str) -> list[int]:
        entry = self.manager.models.get(model)
        return sorted(entry.served) if entry else []

    async def self_test(
        self, criteria: HealthCriteria, staged: Any, version_dir: Path
    ) -> str | None:
        return await self_test_verdict(criteria, staged, version_dir)


class GenerativeStager:
    """The generative models as a :class:`Stager`. ``make`` builds them the first time a
    generative version arrives on an agent whose repository held none (and so never imported
    the token loop); ``models`` is what serves until then (None: nothing)."""

    def __init__(
        self,
        models: GenerativeModels | None,
        make: Callable[[], GenerativeModels],
    ) -> None:
        self._models = models
        self._make = make

    @property
    def models(self) -> GenerativeModels:
        """The generative models, built now if there were none."""
        if self._models is None:
            self._models = self._make()
        return self._models

    @property
    def current(self) -> GenerativeModels | None:
        """The generative models if there are any yet (reading this builds nothing)."""
        return self._models

    async def stage(
        self, model: str, version: int, version_dir: Path, config: ModelConfig
    ) -> GenerativeVersion:
        # a generative version's serving parameters are the agent's [generative] settings;
        # the manifest's config only carries its version policy
        return await self.models.stage(model, version, version_dir)

    def activate(self, model: str, staged: GenerativeVersion) -> dict[int, GenerativeVersion]:
        return self.models.activate(model, staged)

    def restore(
        self,
        model: str,
        previous: dict[int, GenerativeVersion],
        failed: GenerativeVersion,
        reason: str,
    ) -> None:
        self.models.restore(model, previous, failed, reason)

    def settle(self, model: str, previous: dict[int, GenerativeVersion]) -> None:
        self.models.settle(model, previous)

    def discard(self, model: str, staged: GenerativeVersion, reason: str) -> None:
        self.models.discard(model, staged, reason)

    def served_versions(self, model: str) -> list[int]:
        return [] if self._models is None else self._models.served_versions(model)

    async def self_test(
        self, criteria: HealthCriteria, staged: Any, version_dir: Path
    ) -> str | None:
        # its golden sample is checked at validation (greedy decoding across runtimes) and
        # its warm-up ran both step shapes at load: nothing further to run after the window
        return None


class Stagers:
    """The stager for an update: by the artifact's format, or by the model's directory."""

    def __init__(self, batch: BatchStager, generative: GenerativeStager | None) -> None:
        self.batch = batch
        self.generative = generative

    def for_format(self, fmt: str) -> Stager:
        """Raises ProtocolError: a generative artifact for an agent that serves none."""
        if fmt != GENAI_FORMAT:
            return self.batch
        if self.generative is None:
            raise ProtocolError(
                Rejection.LOAD_FAILED, "this agent does not serve generative models"
            )
        return self.generative

    def for_model(self, model: str) -> Stager:
        generative = self.generative is not None and is_generative(
            self.batch.manager.repository / model
        )
        return self.generative if generative and self.generative is not None else self.batch
