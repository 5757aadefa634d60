"""Inference threads run ``runtime.compute_nice_offset`` nice steps below the event loop, on a
real agent with a real ONNX Runtime session: the instance's executor thread and the intra-op
pool thread ONNX Runtime starts while the model loads, read back from the kernel."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from runtimes.settings import RuntimeSettings
from tests.agent.server import copy_models, serve

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")


def nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def native_threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


@pytest.mark.parametrize("offset", [0, 3])
def test_inference_threads_run_the_offset_below_the_event_loop(
    example_repo: Path, tmp_path: Path, offset: int
) -> None:
    base = nice(threading.get_native_id())
    assert base + offset <= 19
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    before = native_threads()
    # two intra-op threads: ONNX Runtime starts a pool thread of its own for the second
    settings = RuntimeSettings(intra_op_threads=2, compute_nice_offset=offset)
    with serve(repo, runtime=settings) as agent:
        assert agent.infer_json("mlp", [[0.5] * 256]).status_code == 200
        python = {t.name: t.native_id for t in threading.enumerate()}
        new_native = native_threads() - before - set(python.values())
        executors = [tid for name, tid in python.items() if name.startswith("mlp:1-")]
        # the thread tests/agent/server.py runs uvicorn's event loop in
        loop = next(tid for name, tid in python.items() if name.endswith("(run)"))
        assert executors, python
        assert new_native, "ONNX Runtime started no intra-op thread"
        assert {nice(t) for t in executors} == {base + offset}
        assert {nice(t) for t in new_native} == {base + offset}
        assert nice(loop) == base, "the event loop's thread was lowered"
