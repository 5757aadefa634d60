"""The inference service: what every transport calls (REST today, MQTT or gRPC tomorrow).

It resolves the model version, validates the request against the signature before it joins a
batch (so one bad request never fails others), applies priority and timeout, and records
statistics and metrics. It knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from agent.errors import AgentError, RequestError, ShuttingDownError
from agent.inference.batch_run import ItemResult
from agent.inference.capture import CaptureTap
from agent.inference.manager import ModelManager
from agent.inference.payload_log import PayloadLog
from agent.inference.pipelined import PipelineVersion, sketched
from agent.inference.predictions import PredictionStore
from agent.inference.sketches import InputSketchBook
from agent.inference.versions import LoadedVersion
from agent.pipelines.errors import StepError
from runtimes.errors import RuntimeFailure

if TYPE_CHECKING:  # metrics read what is served: the composition root hands them in
    from agent.metrics import AgentMetrics

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
    request_id: str | None = None
    """The id the answer carries (the client's or the agent's): a model with
    ``[ground_truth]`` keeps its prediction under it for outcomes posted later."""


@dataclass
class InferResponse:
    model: str
    version: str
    outputs: Arrays
    queue_s: float
    compute_s: float
    batch_rows: int
    steps: tuple[tuple[str, float], ...] = ()
    """A pipeline's seconds per step (Server-Timing, metrics); empty for a plain model."""


class InferenceService:
    def __init__(
        self,
        manager: ModelManager,
        metrics: AgentMetrics,
        *,
        max_rows_per_request: int,
        sketches: InputSketchBook | None = None,
        payloads: PayloadLog | None = None,
        predictions: PredictionStore | None = None,
        capture: CaptureTap | None = None,
    ) -> None:
        self.manager = manager
        self.capture = capture
        """Where models with ``[capture] enabled`` offer their answered requests; None: the
        agent has no spool."""
        self.predictions = predictions
        """Where models with ``[ground_truth]`` keep their predictions; None: not kept."""
        self.metrics = metrics
        self.sketches = sketches
        """Served inputs' sketches for telemetry (drift); None: not sketched."""
        self.payloads = payloads
        """Where models with ``[payload_log] enabled`` record their requests; None: no sink."""
        self.max_rows_per_request = max_rows_per_request
        self.accepting = True

    def resolve(self, model: str, version: str | None) -> LoadedVersion:
        return self.manager.resolve(model, version)

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run ``request`` through its model's batcher (:meth:`submit`) and wait for it; a
        cancelled caller cancels the future it awaits, which drops the request if it has not
        run."""
        return await self.submit(request)

    def submit(
        self, request: InferRequest, resolved: LoadedVersion | None = None
    ) -> asyncio.Future[InferResponse]:
        """Validate ``request`` and queue it; errors found now are raised, later ones end the
        future. Cancelling the future drops the request if it has not run yet. ``resolved``:
        :meth:`resolve` of the request's model and version, by a caller that has not yielded
        to the event loop since (no swap can have come in between)."""
        if not self.accepting:
            raise ShuttingDownError("the agent is shutting down")
        lv = resolved or self.manager.resolve(request.model, request.version)
        if isinstance(lv, PipelineVersion):
            return self._submit_pipeline(lv, request)
        lv.acquire()  # resolved and acquired in one step: a swap cannot slip in
        version = str(lv.version)
        started = time.monotonic()
        try:
            rows, wanted, priority, timeout_s = self._admit(lv, request)
            queued = lv.batcher.submit(
                request.inputs, rows or 1, priority=priority, timeout_s=timeout_s
            )
        except (AgentError, RuntimeFailure) as exc:
            lv.release()
            lv.stats.record_failure(time.monotonic() - started, exc.code)
            self.metrics.observe_failure(lv.model, version, exc.code)
            raise
        except BaseException:
            lv.release()
            raise
        answer: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()

        def ran(done: asyncio.Future[ItemResult]) -> None:
            lv.release()
            if done.cancelled():
                answer.cancel()
                return
            exc = done.exception()
            if exc is not None:
                if isinstance(exc, AgentError | RuntimeFailure):
                    lv.stats.record_failure(time.monotonic() - started, exc.code)
                    self.metrics.observe_failure(lv.model, version, exc.code)
                if not answer.done():
                    answer.set_exception(exc)
                return
            answer.remove_done_callback(given_up)  # nothing to give up any more
            result = done.result()
            self._observe(lv, version, request, rows or 1, result, time.monotonic() - started)
            if answer.done():  # given up on while it ran
                return
            outputs = result.outputs if wanted is None else {k: result.outputs[k] for k in wanted}
            answer.set_result(
                InferResponse(
                    lv.model,
                    version,
                    outputs,
                    result.queue_s,
                    result.compute_s,
                    result.batch_rows,
                )
            )

        def given_up(done: asyncio.Future[InferResponse]) -> None:
            if done.cancelled() and not queued.done():
                lv.batcher.cancel(queued)

        queued.add_done_callback(ran)
        answer.add_done_callback(given_up)
        return answer

    def _observe(
        self,
        lv: LoadedVersion,
        version: str,
        request: InferRequest,
        rows: int,
        result: ItemResult,
        total: float,
    ) -> None:
        """An answered request's statistics, metrics, input sketch, shadow copy and payload
        record."""
        lv.stats.record_success(
            total, result.queue_s, result.compute_s, result.input_s, result.output_s
        )
        self.metrics.observe_success(lv.model, version, total, result.queue_s, result.compute_s)
        if self.sketches is not None:
            self.sketches.observe(lv.model, lv.version, request.inputs, result.outputs)
        if self.manager.shadows.by_model:  # a copy for a staged candidate, never awaited
            self.manager.shadows.offer(lv, request.inputs, rows, result.outputs, result.compute_s)
        if self.payloads is not None and lv.config.payload_log.enabled:
            self.payloads.offer(
                lv.model, version, lv.config.payload_log, request.inputs, result.outputs
            )
        if self.capture is not None and lv.config.capture.enabled:
            self.capture.offer(
                lv.model, lv.version, lv.config.capture, request.inputs, result.outputs
            )
        truth = lv.config.ground_truth
        if truth.task is not None and request.request_id and self.predictions is not None:
            outputs = result.outputs
            judged = (
                outputs.get(truth.output) if truth.output else next(iter(outputs.values()), None)
            )
            if judged is not None:
                self.predictions.record(
                    request.request_id, lv.model, lv.version, truth.task, judged
                )

    def capture_disagreement(
        self, model: str, version: int, inputs: Arrays, outputs: Arrays
    ) -> None:
        """A shadow candidate disagreed with ``model`` v``version``'s answer ``outputs``."""
        entry = self.manager.models.get(model)
        if self.capture is not None and entry is not None:
            self.capture.offer_disagreement(model, version, entry.config.capture, inputs, outputs)

    def _submit_pipeline(
        self, lv: PipelineVersion, request: InferRequest
    ) -> asyncio.Future[InferResponse]:
        """Run ``request`` through ``lv``'s pipeline; its model steps join their models'
        batchers. The task is the answer: whoever awaits it (the transport) cancels it."""
        lv.acquire()
        version = str(lv.version)
        started = time.monotonic()
        try:
            _, wanted, priority, timeout_s = self._admit(lv, request)
        except (AgentError, RuntimeFailure) as exc:
            lv.release()
            lv.stats.record_failure(time.monotonic() - started, exc.code)
            self.metrics.observe_failure(lv.model, version, exc.code)
            raise
        except BaseException:
            lv.release()
            raise

        call = self.manager.model_caller(lv, priority, timeout_s)
        if self.sketches is not None:  # at its model step: what the reference is made of
            call = sketched(call, self.sketches, lv)

        async def run() -> InferResponse:
            assert lv.pipeline is not None
            try:
                result = await lv.pipeline.run(request.inputs, call, self.manager.step_executor)
            except (AgentError, StepError, RuntimeFailure) as exc:
                lv.stats.record_failure(time.monotonic() - started, exc.code)
                self.metrics.observe_failure(lv.model, version, exc.code)
                raise
            finally:
                lv.release()
            total = time.monotonic() - started
            lv.stats.record_success(total, result.queue_s, result.compute_s)
            self.metrics.observe_success(lv.model, version, total, result.queue_s, result.compute_s)
            self.metrics.observe_steps(lv.model, version, result.timings)
            if self.payloads is not None and lv.config.payload_log.enabled:
                self.payloads.offer(
                    lv.model, version, lv.config.payload_log, request.inputs, result.outputs
                )
            if self.capture is not None and lv.config.capture.enabled:
                # the raw input the app sent (an image's bytes), not the model's tensors
                self.capture.offer(
                    lv.model, lv.version, lv.config.capture, request.inputs, result.outputs
                )
            outputs = result.outputs if wanted is None else {k: result.outputs[k] for k in wanted}
            rows = next(iter(outputs.values())).shape[0] if outputs else 0
            return InferResponse(
                lv.model,
                version,
                outputs,
                result.queue_s,
                result.compute_s,
                rows,
                tuple(result.timings),
            )

        return asyncio.ensure_future(run())

    def _admit(
        self, lv: LoadedVersion, request: InferRequest
    ) -> tuple[int | None, list[str] | None, int, float | None]:
        """Rows, wanted outputs, priority level and queue timeout of a request, checked."""
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
        return rows, wanted, priority, timeout_us / 1e6 or None

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
