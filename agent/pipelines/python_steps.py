"""A Python step's worker process, seen from the agent: start, call with a timeout, replace.

Calls to one step take turns on its one worker. The worker answers each call with tensors or
the error its code raised (422). A worker that dies mid-call (a segfault, the memory or CPU
limit) fails that call (502); one that passes the step's timeout is killed (504). Either way
the next call starts a fresh worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

import numpy as np

from agent.pipelines import frames
from agent.pipelines.errors import StepCrashedError, StepFailedError, StepTimeoutError
from agent.pipelines.settings import PipelineSettings

log = logging.getLogger("edgefleet.agent.pipelines")
START_TIMEOUT_S = 30.0
"""Longest a worker may take to import the file and run its ``setup``."""


class WorkerStartError(Exception):
    """The worker did not start: the file does not import, or its setup raised."""


class PythonWorker:
    def __init__(
        self, step: str, file: Path, parameters: dict[str, object], settings: PipelineSettings
    ) -> None:
        self.step = step
        self.file = file
        self.parameters = parameters
        self.settings = settings
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self.restarts = 0

    async def start(self) -> None:
        """Start the worker and wait until the file imported and its setup ran.

        Raises:
            WorkerStartError: with the file's own error.
        """
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent.pipelines.python_worker",
            str(self.file),
            json.dumps(self.parameters),
            str(self.settings.python_worker_memory_mb * 2**20),
            str(self.settings.python_worker_cpu_s),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                _, error = await self._receive(proc)
        except (TimeoutError, asyncio.IncompleteReadError, frames.FrameError) as exc:
            await _kill(proc)
            raise WorkerStartError(
                f"step {self.step}: the worker of {self.file.name} did not start: "
                f"{_death(proc, exc)}"
            ) from None
        if error is not None:
            await _kill(proc)
            raise WorkerStartError(f"step {self.step}: {self.file.name}: {error}")
        self._proc = proc

    async def call(self, inputs: dict[str, np.ndarray], timeout_s: float) -> dict[str, np.ndarray]:
        async with self._lock:
            if self._proc is None or self._proc.returncode is not None:
                self.restarts += 1
                try:
                    await self.start()
                except WorkerStartError as exc:
                    raise StepCrashedError(str(exc)) from None
            proc = self._proc
            assert proc is not None and proc.stdin is not None
            try:
                async with asyncio.timeout(timeout_s):
                    proc.stdin.write(frames.encode(inputs))
                    await proc.stdin.drain()
                    outputs, error = await self._receive(proc)
            except TimeoutError:
                await self._replace()
                raise StepTimeoutError(
                    f"step {self.step}: passed its timeout of {timeout_s:g} s; worker replaced"
                ) from None
            except (asyncio.IncompleteReadError, ConnectionError, frames.FrameError) as exc:
                await self._replace()
                raise StepCrashedError(
                    f"step {self.step}: the worker of {self.file.name} failed: {_death(proc, exc)}"
                ) from None
            if error is not None:
                raise StepFailedError(f"step {self.step}: {error}")
            return outputs

    async def _receive(
        self, proc: asyncio.subprocess.Process
    ) -> tuple[dict[str, np.ndarray], str | None]:
        assert proc.stdout is not None
        (length,) = frames.LENGTH.unpack(await proc.stdout.readexactly(frames.LENGTH.size))
        if length > frames.MAX_FRAME_BYTES:
            raise frames.FrameError(f"a frame of {length} bytes")
        return frames.decode(await proc.stdout.readexactly(length))

    async def _replace(self) -> None:
        """Kill the worker; the next call starts a new one."""
        if self._proc is not None:
            await _kill(self._proc)
            log.warning(
                "python step worker replaced",
                extra={"step": self.step, "file": str(self.file), "exit": self._proc.returncode},
            )
        self._proc = None

    async def close(self) -> None:
        async with self._lock:
            if self._proc is not None:
                await _kill(self._proc)
                self._proc = None


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    if proc.stdin is not None:
        proc.stdin.close()
    await proc.wait()


def _death(proc: asyncio.subprocess.Process, exc: BaseException) -> str:
    code = proc.returncode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    if code is not None:
        return f"exited with status {code}"
    return str(exc) or type(exc).__name__
