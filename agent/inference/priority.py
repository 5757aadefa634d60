"""Inference threads run below the event loop's CPU priority (Linux).

When the models keep every core busy, the kernel shares the cores between the event loop
(reading requests, admission, shedding, health probes, metrics) and the inference threads by
their weights, and at equal priority it preempts the loop in the middle of a request as often
as anything else. ``runtime.compute_nice_offset`` runs every thread that computes (each
instance's executor thread, and the threads a backend starts while it loads, such as ONNX
Runtime's intra-op pool) that many nice steps below the thread that started it: the loop then
runs when it has work, and the inference threads take every cycle it leaves. Linux keeps the
nice value per thread and a new thread inherits its creator's, so lowering the thread that
loads a model lowers the backend's own threads too.

Raising a nice value needs no privilege, but lowering it back does: a thread lowered here stays
lowered, which is why loading runs in a thread of its own rather than in a shared pool. Other
systems, and a value of 0, leave every thread as it is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

log = logging.getLogger("edgefleet.agent.priority")

T = TypeVar("T")

MAX_NICE = 19


def lower_this_thread(offset: int) -> None:
    """Run the calling thread ``offset`` nice steps below its current priority (at most to
    19). A thread the system refuses to lower keeps running as it is; this never raises."""
    if offset <= 0 or sys.platform != "linux":
        return
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, now + offset))
    except OSError as exc:
        log.warning("could not lower an inference thread's priority", extra={"error": str(exc)})


async def run_lowered(offset: int, name: str, fn: Callable[[], T]) -> T:
    """``fn()`` in a new thread ``offset`` nice steps below the caller's, so the threads it
    starts inherit that priority. Like :func:`asyncio.to_thread`, a cancelled caller stops
    waiting but not ``fn``."""
    done: Future[T] = Future()

    def target() -> None:
        lower_this_thread(offset)
        try:
            done.set_result(fn())
        except BaseException as exc:  # handed to the caller, whatever it is
            done.set_exception(exc)

    done.set_running_or_notify_cancel()
    threading.Thread(target=target, name=name, daemon=True).start()
    return await asyncio.wrap_future(done)
