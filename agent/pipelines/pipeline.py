"""A pipeline bound to a version: its steps as functions, workers and model calls, and how a
request runs through them.

Steps run in the order configured, in stages: a run of built-in steps is one hop to the step
threads (Pillow and numpy release the GIL), a run of model and Python steps that do not read
each other's tensors runs concurrently (Triton's ensemble scheduler starts a step as soon as
its inputs are ready; consecutive independent steps are where that matters). Model steps go
through their model's own batcher, so requests of many pipelines share batches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.pipelines.cgroups import Cgroups
from agent.pipelines.errors import StepFailedError, StepTimeoutError
from agent.pipelines.python_steps import PythonWorker
from agent.pipelines.settings import PipelineSettings
from common import pipeline_steps as builtin
from common.pipeline_config import ModelStep, PipelineConfig, PythonStep, Step
from runtimes.datatypes import from_numpy
from runtimes.signature import ModelSignature, TensorSpec

if TYPE_CHECKING:  # what a model step returns: the inference service's, which builds on this
    from agent.inference.batch_run import ItemResult

Arrays = dict[str, np.ndarray]
ModelCall = Callable[[str, ModelStep, Arrays], Awaitable["ItemResult"]]
"""Runs a model step's inputs through its model's batcher: (step name, step, inputs)."""


@dataclass
class PipelineResult:
    outputs: Arrays
    timings: list[tuple[str, float]]
    """Seconds per step, in the order they finished."""
    queue_s: float = 0.0
    compute_s: float = 0.0
    """Summed over the model steps."""


@dataclass
class _Stage:
    builtin: bool
    steps: list[tuple[str, Step]] = field(default_factory=list)


class Pipeline:
    def __init__(
        self,
        config: PipelineConfig,
        functions: dict[str, builtin.StepFn],
        workers: dict[str, PythonWorker],
        settings: PipelineSettings,
    ) -> None:
        self.config = config
        self.settings = settings
        self._functions = functions
        self.workers = workers
        self.signature = ModelSignature(
            inputs=tuple(
                TensorSpec(name=t.name, datatype=t.datatype, shape=t.shape) for t in config.inputs
            ),
            outputs=tuple(
                TensorSpec(name=t.name, datatype=t.datatype, shape=t.shape) for t in config.outputs
            ),
        )
        self._stages = _stages(config)

    @classmethod
    async def build(
        cls,
        config: PipelineConfig,
        version_dir: Path,
        model_signature: ModelSignature | None,
        settings: PipelineSettings,
        *,
        python_allowed: str | None,
        decode_budget: builtin.DecodeBudget | None = None,
        cgroups: Cgroups | None = None,
    ) -> Pipeline:
        """Bind the steps and start the Python steps' workers.

        ``python_allowed``: None when Python steps may run, else why not.

        Raises:
            ValueError: a step cannot be bound, a Python step may not run, or its worker did not
                start (:class:`~agent.pipelines.python_steps.WorkerStartError`).
        """
        image_size = builtin.image_input_size(config, model_signature)
        functions: dict[str, builtin.StepFn] = {}
        workers: dict[str, PythonWorker] = {}
        try:
            for name, step in config.named_steps():
                if isinstance(step, ModelStep):
                    if not step.model and model_signature is None:
                        raise ValueError(f"step {name}: this version has no model file of its own")
                elif isinstance(step, PythonStep):
                    if python_allowed is not None:
                        raise ValueError(f"step {name}: Python steps may not run: {python_allowed}")
                    path = version_dir / step.file
                    if not path.is_file():
                        raise ValueError(f"step {name}: no file {step.file} in {version_dir}")
                    worker = PythonWorker(
                        name, path, dict(step.parameters), settings, step.network, cgroups
                    )
                    await worker.start()
                    workers[name] = worker
                else:
                    functions[name] = builtin.bind(
                        name,
                        step,
                        version_dir,
                        image_size,
                        settings.max_image_pixels,
                        settings.max_request_pixels,
                        decode_budget,
                    )
        except BaseException:
            for worker in workers.values():
                await worker.close()
            raise
        return cls(config, functions, workers, settings)

    async def close(self) -> None:
        for worker in self.workers.values():
            await worker.close()

    async def run(
        self, inputs: Arrays, call_model: ModelCall, executor: Executor
    ) -> PipelineResult:
        tensors = dict(inputs)
        result = PipelineResult({}, [])
        for stage in self._stages:
            if stage.builtin:
                tensors |= await self._run_builtin(stage, tensors, executor, result)
                continue
            calls = [
                self._call(name, step, tensors, call_model, result) for name, step in stage.steps
            ]
            for produced in await _all_or_first_error(calls):
                tensors |= produced
        for spec in self.signature.outputs:
            array = tensors[spec.name]
            try:
                datatype = from_numpy(array.dtype)
            except KeyError:
                datatype = str(array.dtype)
            fixed = (want in (-1, got) for got, want in zip(array.shape, spec.shape, strict=False))
            if datatype != spec.datatype or len(array.shape) != len(spec.shape) or not all(fixed):
                raise StepFailedError(
                    f"output {spec.name!r} is {datatype} {list(array.shape)}, the pipeline "
                    f"declares {spec.datatype} {spec.describe_shape()}"
                )
            result.outputs[spec.name] = array
        return result

    async def _run_builtin(
        self, stage: _Stage, tensors: Arrays, executor: Executor, result: PipelineResult
    ) -> Arrays:
        current = [stage.steps[0][0]]
        timings: list[tuple[str, float]] = []

        def chain() -> Arrays:
            local = dict(tensors)  # a step left behind by a timeout must not touch the caller's
            produced: Arrays = {}
            for name, step in stage.steps:
                current[0] = name
                started = time.monotonic()
                try:
                    out = self._functions[name](local)
                except (ArithmeticError, ValueError, TypeError, IndexError) as exc:
                    # a configuration that does not fit the data (three means, one channel)
                    raise StepFailedError(f"step {name}: {exc}") from exc
                took = time.monotonic() - started
                if took > self._timeout(step):  # finished, but too late to be of use
                    raise StepTimeoutError(
                        f"step {name}: took {took:.3g} s, past its timeout of "
                        f"{self._timeout(step):g} s"
                    )
                timings.append((name, took))
                local |= out
                produced |= out
            return produced

        timeout = sum(self._timeout(step) for _, step in stage.steps)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                produced = await loop.run_in_executor(executor, chain)
        except TimeoutError:
            raise StepTimeoutError(
                f"step {current[0]}: passed its timeout ({timeout:g} s for "
                f"{', '.join(n for n, _ in stage.steps)})"
            ) from None
        result.timings += timings
        return produced

    async def _call(
        self, name: str, step: Step, tensors: Arrays, call_model: ModelCall, result: PipelineResult
    ) -> Arrays:
        assert isinstance(step, ModelStep | PythonStep)
        given = {inner: tensors[outer] for inner, outer in step.inputs.items()}
        started = time.monotonic()
        if isinstance(step, ModelStep):
            try:
                async with asyncio.timeout(self._timeout(step)):
                    answer = await call_model(name, step, given)
            except TimeoutError:
                raise StepTimeoutError(
                    f"step {name}: passed its timeout of {self._timeout(step):g} s"
                ) from None
            outputs = answer.outputs
            result.queue_s += answer.queue_s
            result.compute_s += answer.compute_s
        else:
            outputs = await self.workers[name].call(given, self._timeout(step))
        result.timings.append((name, time.monotonic() - started))
        missing = [inner for inner in step.outputs if inner not in outputs]
        if missing:
            raise StepFailedError(
                f"step {name}: gave no {missing[0]!r} (it gave {sorted(outputs)})"
            )
        return {outer: outputs[inner] for inner, outer in step.outputs.items()}

    def _timeout(self, step: Step) -> float:
        return step.timeout_s or self.settings.step_timeout_s


def _stages(config: PipelineConfig) -> list[_Stage]:
    stages: list[_Stage] = []
    for name, step in config.named_steps():
        is_builtin = not isinstance(step, ModelStep | PythonStep)
        last = stages[-1] if stages else None
        joins = (
            last is not None
            and last.builtin == is_builtin
            and (
                is_builtin
                # a call joins the calls before it only if it reads none of their tensors
                or not set(step.reads()) & {t for _, s in last.steps for t in s.writes()}
            )
        )
        if last is None or not joins:
            stages.append(last := _Stage(is_builtin))
        last.steps.append((name, step))
    return stages


async def _all_or_first_error(calls: list[Coroutine[Any, Any, Arrays]]) -> list[Arrays]:
    if len(calls) == 1:
        return [await calls[0]]
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            exc = task.exception()
            if exc is not None:
                raise exc
        return [t.result() for t in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
