"""A fleet client's MQTT calls do not swallow the cancellation that stops the agent."""

from __future__ import annotations

import asyncio
import sys

import pytest

from agent.fleet.client import uncancelled


async def _cancelled_as_the_call_completes(wrap: bool) -> str:
    """A task awaiting an MQTT call as aiomqtt makes it (through ``asyncio.wait_for``) is
    cancelled in the same step as the call completes: the agent stopping just as the broker
    acknowledges a publish."""
    acknowledged: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def drain() -> str:
        call = asyncio.wait_for(acknowledged, timeout=10)
        await (uncancelled(call) if wrap else call)
        return "carried on"

    task = asyncio.create_task(drain())
    await asyncio.sleep(0)  # the task now waits for the acknowledgement
    acknowledged.set_result(None)
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return "stopped"


def test_a_cancellation_at_the_moment_a_call_completes_stops_the_task() -> None:
    assert asyncio.run(_cancelled_as_the_call_completes(wrap=True)) == "stopped"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for keeps cancellations from 3.12")
def test_without_the_guard_python_311_wait_for_drops_the_cancellation() -> None:
    """Why the guard is there: the unguarded task carries on as if never cancelled."""
    assert asyncio.run(_cancelled_as_the_call_completes(wrap=False)) == "carried on"


def test_an_ordinary_call_returns_its_result() -> None:
    async def main() -> int:
        return await uncancelled(asyncio.sleep(0, result=7))

    assert asyncio.run(main()) == 7
