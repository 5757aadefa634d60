"""The worker process of a Python step: ``python -m agent.pipelines.python_worker``.

Runs in a process of its own with resource limits, so that what the user's file does (a
crash, a hang, a leak) costs a request and a worker, never the agent. The user's file defines
``process(inputs: dict[str, numpy.ndarray]) -> dict[str, numpy.ndarray]`` and optionally
``setup(parameters: dict) -> None``, called once at start (docs/pipelines.md).

Arguments: the file, the parameters as JSON, the memory limit (bytes) and the CPU seconds
one call may use. Frames (:mod:`agent.pipelines.frames`) come on stdin and go to the original
stdout; the user's prints go to stderr.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import sys
from typing import Any, BinaryIO

import numpy as np

from agent.pipelines import frames


def _read(stream: BinaryIO) -> bytes | None:
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
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    # no core files: a crash is reported at once, and leaves nothing of the user's data behind
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the user's prints must not corrupt the frames
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
            reply = frames.encode(error=f"{type(exc).__name__}: {exc}")
        channel.write(reply)
        channel.flush()
    return 0


def _checked(outputs: Any) -> dict[str, np.ndarray]:
    if not isinstance(outputs, dict) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in outputs.items()
    ):
        raise TypeError("process() must return a dict of str to numpy.ndarray")
    return outputs


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
