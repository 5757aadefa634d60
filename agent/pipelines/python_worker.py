"""The worker process of a Python step: ``python -m agent.pipelines.python_worker``.

Runs in a process of its own with resource limits, so that what the user's file does (a
crash, a hang, a leak) costs a request and a worker, never the agent. The user's file defines
``process(inputs: dict[str, numpy.ndarray]) -> dict[str, numpy.ndarray]`` and optionally
``setup(parameters: dict) -> None``, called once at start (docs/pipelines.md).

Arguments: the file, the parameters as JSON, the memory limit (bytes), the CPU seconds
one call may use, whether the step may use the network (``1``/``0``), the most processes it
may hold and its cgroup (empty: none). Before the file is imported the worker walls itself in
(:mod:`agent.pipelines.sandbox`). Frames (:mod:`agent.pipelines.frames`) come on stdin and go
to the original stdout; the user's prints go to stderr, which the agent logs.

A call whose error is the process limit (``fork`` or a thread start refused with EAGAIN) ends
the worker with :data:`PROCESS_LIMIT_EXIT`: its PID namespace, and so whatever the call
started, ends with it, and the agent answers that call as a crash naming the limit.
"""

from __future__ import annotations

import errno
import importlib.util
import io
import json
import os
import resource
import sys
from typing import TYPE_CHECKING, Any, BinaryIO

from agent.pipelines import sandbox

if TYPE_CHECKING:
    import numpy as np

PROCESS_LIMIT_EXIT = 75
"""The worker's exit status when a call ran into its process limit (EX_TEMPFAIL)."""


def _read(stream: BinaryIO) -> bytes | None:
    from agent.pipelines import frames

    head = stream.read(frames.LENGTH.size)
    if len(head) < frames.LENGTH.size:
        return None
    (length,) = frames.LENGTH.unpack(head)
    return stream.read(length)


def _cpu_used_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    path, parameters, memory_bytes, cpu_s = argv[0], json.loads(argv[1]), int(argv[2]), int(argv[3])
    sandbox.enter(network=argv[4] == "1", max_processes=int(argv[5]), cgroup=argv[6] or None)
    worker = os.getpid()
    # imported only now: unshare() refuses a process with threads, and numpy's BLAS may start some
    from agent.pipelines import frames

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    # no core files: a crash is reported at once, and leaves nothing of the user's data behind
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the user's prints must not corrupt the frames
    # and reach the agent's log as they are made, not at an exit that a crash never reaches
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    requests = sys.stdin.buffer
    try:
        spec = importlib.util.spec_from_file_location("edgefleet_user_step", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        process = getattr(module, "process", None)
        if not callable(process):
            raise TypeError(f"{os.path.basename(path)} defines no process(inputs) function")
        setup = getattr(module, "setup", None)
        if callable(setup):
            setup(parameters)
    except Exception as exc:  # the user's code: any error is its report
        channel.write(frames.encode(error=f"{type(exc).__name__}: {exc}"))
        channel.flush()
        return 1
    channel.write(frames.encode({}))
    channel.flush()
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    while (payload := _read(requests)) is not None:
        inputs, _ = frames.decode(payload)
        soft = int(_cpu_used_s()) + cpu_s + 1  # this call's CPU budget; SIGXCPU beyond
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard < 0 else min(soft, hard), hard))
        try:
            outputs = _checked(process(inputs))
            reply = frames.encode(outputs)
        except Exception as exc:  # the user's code: its message goes back to the client
            if os.getpid() == worker and _at_the_process_limit(exc):
                os._exit(PROCESS_LIMIT_EXIT)
            reply = frames.encode(error=f"{type(exc).__name__}: {exc}")
        if os.getpid() != worker:
            # a child the user's code forked, back from process(): it must not answer
            os._exit(0)
        channel.write(reply)
        channel.flush()
    return 0


def _at_the_process_limit(exc: BaseException) -> bool:
    """A fork refused (EAGAIN) or a thread that could not start, here or as the cause, while
    this process cannot fork either (a non-blocking socket's EAGAIN is not the limit)."""
    seen: BaseException | None = exc
    while seen is not None and not (
        (isinstance(seen, OSError) and seen.errno == errno.EAGAIN)
        or (isinstance(seen, RuntimeError) and "can't start new thread" in str(seen))
    ):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return False
    try:
        probe = os.fork()
    except OSError as refused:
        return refused.errno == errno.EAGAIN
    if probe == 0:
        os._exit(0)
    os.waitpid(probe, 0)
    return False


def _checked(outputs: Any) -> dict[str, np.ndarray]:
    import numpy as np

    if not isinstance(outputs, dict) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in outputs.items()
    ):
        raise TypeError("process() must return a dict of str to numpy.ndarray")
    return outputs


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
