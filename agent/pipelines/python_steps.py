"""A Python step's worker process, seen from the agent: start, call with a timeout, replace.

Calls to one step take turns on its one worker. The worker answers each call with tensors or
the error its code raised (422). A worker that dies mid-call (a segfault, the memory or CPU
limit, the process limit) fails that call (502); one that passes the step's timeout is killed
(504). Either way the next call starts a fresh worker. What the worker's processes write on
stderr (the user's prints, a traceback) is logged a record a line, with the step's name.
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

from agent.pipelines import cgroups, frames
from agent.pipelines.errors import StepCrashedError, StepFailedError, StepTimeoutError
from agent.pipelines.python_worker import PROCESS_LIMIT_EXIT
from agent.pipelines.settings import PipelineSettings

log = logging.getLogger("edgefleet.agent.pipelines")
START_TIMEOUT_S = 30.0
"""Longest a worker may take to import the file and run its ``setup``."""


class WorkerStartError(Exception):
    """The worker did not start: the file does not import, or its setup raised."""


class PythonWorker:
    def __init__(
        self,
        step: str,
        file: Path,
        parameters: dict[str, object],
        settings: PipelineSettings,
        network: bool = False,
        groups: cgroups.Cgroups | None = None,
    ) -> None:
        self.step = step
        self.file = file
        self.parameters = parameters
        self.settings = settings
        self.network = network
        self.groups = groups
        self._proc: asyncio.subprocess.Process | None = None
        self._cgroup: Path | None = None
        self._output: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.restarts = 0

    async def start(self) -> None:
        """Start the worker and wait until the file imported and its setup ran.

        Raises:
            WorkerStartError: with the file's own error.
        """
        memory_bytes = self.settings.python_worker_memory_mb * 2**20
        max_processes = self.settings.python_worker_max_processes
        try:
            self._cgroup = self.groups.make(max_processes, memory_bytes) if self.groups else None
        except OSError as exc:
            raise WorkerStartError(f"step {self.step}: no cgroup for its worker: {exc}") from None
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent.pipelines.python_worker",
            str(self.file),
            json.dumps(self.parameters),
            str(memory_bytes),
            str(self.settings.python_worker_cpu_s),
            "1" if self.network else "0",
            str(max_processes),
            str(self._cgroup or ""),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=worker_environment(),
            start_new_session=True,  # a group of its own, killed as one (_kill)
        )
        assert proc.stderr is not None
        self._output = asyncio.create_task(
            _log_output(proc.stderr, self.step), name=f"python step {self.step} output"
        )
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                _, error = await self._receive(proc)
        except (TimeoutError, asyncio.IncompleteReadError, frames.FrameError) as exc:
            await self._kill(proc)
            raise WorkerStartError(
                f"step {self.step}: the worker of {self.file.name} did not start: "
                f"{self._death(proc, exc)}"
            ) from None
        if error is not None:
            await self._kill(proc)
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
                # a worker that died ends its launcher soon after: its status names the cause
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await proc.wait()
                await self._replace()
                raise StepCrashedError(
                    f"step {self.step}: the worker of {self.file.name} failed: "
                    f"{self._death(proc, exc)}"
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
            await self._kill(self._proc)
            log.warning(
                "python step worker replaced",
                extra={"step": self.step, "file": str(self.file), "exit": self._proc.returncode},
            )
        self._proc = None

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        """Kill the worker's whole process group (its launcher leads it; what the user's code
        started goes with its PID namespace, see :mod:`agent.pipelines.sandbox`), and its
        cgroup where it has one; then log the rest of its output."""
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if self._cgroup is not None:
            cgroups.kill(self._cgroup)
            self._cgroup = None
        if proc.stdin is not None:
            proc.stdin.close()
        await proc.wait()
        if self._output is not None:
            # a child that left the group (no namespaces) may hold stderr open: not for long
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self._output)
            self._output.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._output
            self._output = None

    def _death(self, proc: asyncio.subprocess.Process, exc: BaseException) -> str:
        return _describe(proc.returncode, exc, self.settings.python_worker_max_processes)

    async def close(self) -> None:
        async with self._lock:
            if self._proc is not None:
                await self._kill(self._proc)
                self._proc = None


KEPT_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "PYTHONHOME")
"""What a worker keeps of the agent's environment: enough to start Python, nothing of the
agent's own (its API keys, broker credentials, ``EDGEFLEET_*`` settings)."""


def worker_environment() -> dict[str, str]:
    env = {k: os.environ[k] for k in KEPT_ENVIRONMENT if k in os.environ}
    return env | {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


async def _log_output(stream: asyncio.StreamReader, step: str) -> None:
    """Log each line the worker's processes write on stderr until the last of them is gone."""
    while True:
        try:
            line = await stream.readline()
        except ValueError:  # past the reader's limit (64 KiB): the rest of the line is dropped
            line = b"(a line of more than 64 KiB, left out)"
        if not line:
            return
        if text := line.decode("utf-8", "replace").rstrip():
            log.info(text, extra={"step": step, "source": "python step"})


def _describe(code: int | None, exc: BaseException, max_processes: int) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    if code == PROCESS_LIMIT_EXIT:
        return (
            f"it reached its limit of {max_processes} processes "
            "(pipelines.python_worker_max_processes); it and all it started were killed"
        )
    if code is not None:
        return f"exited with status {code}"
    return str(exc) or type(exc).__name__
