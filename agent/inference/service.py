"""The inference service: what every transport calls (REST today, MQTT or gRPC tomorrow).

It resolves the model version, validates the request against the signature before it joins a
batch (so one bad request never fails others), applies priority and timeout, and records
statistics and metrics. It knows nothing of HTTP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from agent.errors import AgentError, RequestError, ShuttingDownError
from agent.inference.manager import ModelManager
from agent.inference.versions import LoadedVersion
from agent.metrics import AgentMetrics
from runtimes.errors import RuntimeFailure

Arrays = dict[str, np.ndarray]


@dataclass
class InferRequest:
    model: str
    inputs: Arrays
    version: str | None = None
    outputs: list[str] | None = None
    """Output names to return; None returns all."""
    priority: int = 0
    """1 is the highest; 0 means the model's default level."""
    timeout_us: int | None = None
    """Queue timeout; None means the model's default_timeout_us."""


@dataclass
class InferResponse:
    model: str
    version: str
    outputs: Arrays
    queue_s: float
    compute_s: float
    batch_rows: int
    signature_outputs: dict[str, str] = field(default_factory=dict)
    """Datatype of each output by name."""


class InferenceService:
    def __init__(
        self, manager: ModelManager, metrics: AgentMetrics, *, max_rows_per_request: int
    ) -> None:
        self.manager = manager
        self.metrics = metrics
        self.max_rows_per_request = max_rows_per_request
        self.accepting = True

    def resolve(self, model: str, version: str | None) -> LoadedVersion:
        return self.manager.resolve(model, version)

    async def infer(self, request: InferRequest) -> InferResponse:
        if not self.accepting:
            raise ShuttingDownError("the agent is shutting down")
        lv = self.manager.resolve(request.model, request.version)
        lv.acquire()  # no await between resolve and acquire: a swap cannot slip in
        version = str(lv.version)
        started = time.monotonic()
        try:
            rows = lv.signature.validate_inputs(request.inputs)
            if rows is not None and rows > self.max_rows_per_request:
                raise RequestError(
                    f"inputs: {rows} rows exceed the limit of {self.max_rows_per_request} "
                    "per request (max_rows_per_request)",
                    field="inputs",
                )
            wanted = self._check_outputs(lv, request.outputs)
            batching = lv.config.batching
            priority = request.priority or batching.default_priority
            if not 1 <= priority <= batching.priority_levels:
                raise RequestError(
                    f"parameters.priority {request.priority} is outside "
                    f"1..{batching.priority_levels} (model {lv.model} has "
                    f"{batching.priority_levels} priority levels)",
                    field="parameters.priority",
                )
            timeout_us = (
                batching.default_timeout_us if request.timeout_us is None else request.timeout_us
            )
            if timeout_us < 0:
                raise RequestError(
                    "parameters.timeout must not be negative", field="parameters.timeout"
                )
            result = await lv.batcher.infer(
                request.inputs, rows or 1, priority=priority, timeout_s=timeout_us / 1e6 or None
            )
        except (AgentError, RuntimeFailure) as exc:
            lv.stats.record_failure(time.monotonic() - started, exc.code)
            self.metrics.observe_failure(lv.model, version, exc.code)
            raise
        finally:
            lv.release()
        total = time.monotonic() - started
        lv.stats.record_success(total, result.queue_s, result.compute_s)
        self.metrics.observe_success(lv.model, version, total, result.queue_s, result.compute_s)
        outputs = result.outputs if wanted is None else {k: result.outputs[k] for k in wanted}
        return InferResponse(
            lv.model,
            version,
            outputs,
            result.queue_s,
            result.compute_s,
            result.batch_rows,
            {t.name: t.datatype for t in lv.signature.outputs},
        )

    @staticmethod
    def _check_outputs(lv: LoadedVersion, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        known = lv.signature.output_names()
        for i, name in enumerate(names):
            if name not in known:
                raise RequestError(
                    f"outputs[{i}].name: model {lv.model} has no output {name!r} (it has {known})",
                    field=f"outputs[{i}].name",
                )
        return names
