"""A handler's wait for its result ends when the client goes: by the connection's callback
under the agent's own protocol, by ``http.disconnect`` under any other ASGI server.

The end-to-end case (a queued request leaves the batcher's queue when its client closes the
socket) is in test_scheduling.py; these pin down the cancellation rules around it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.types import Message, Scope

from agent.http.connection import CONNECTION_KEY, Connection
from agent.http.transport import ClientGone, until_disconnect


def request_on(connection: Connection | None, receive: Any = None) -> tuple[Scope, Any]:
    """The scope and ``receive`` of a request on ``connection``."""
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": []}
    if connection is not None:
        scope[CONNECTION_KEY] = connection
    return scope, receive


class Work:
    """A result that never comes unless set; records whether it was cancelled."""

    def __init__(self) -> None:
        self.result: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.cancelled = False

    async def run(self) -> str:
        try:
            return await self.result
        except asyncio.CancelledError:
            self.cancelled = True
            raise


def test_a_lost_connection_cancels_the_work_and_answers_client_gone() -> None:
    async def main() -> None:
        connection, work = Connection(), Work()
        asyncio.get_running_loop().call_later(0.01, connection.lose)
        with pytest.raises(ClientGone):
            await until_disconnect(*request_on(connection), work.run())
        assert work.cancelled
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # nothing left pending
        await asyncio.sleep(0)  # and no cancellation lands later

    asyncio.run(main())


def test_a_finished_request_leaves_nothing_on_its_connection() -> None:
    async def main() -> None:
        connection, work = Connection(), Work()
        work.result.set_result("done")
        assert await until_disconnect(*request_on(connection), work.run()) == "done"
        connection.lose()  # the next client disconnect must not cancel this task
        await asyncio.sleep(0)

    asyncio.run(main())


def test_an_already_lost_connection_answers_client_gone_without_running_the_work() -> None:
    async def main() -> None:
        connection, work = Connection(), Work()
        connection.lose()
        with pytest.raises(ClientGone):
            await until_disconnect(*request_on(connection), work.run())
        assert not work.cancelled  # closed before it started

    asyncio.run(main())


def test_a_cancellation_from_elsewhere_is_not_taken_for_a_disconnect() -> None:
    async def main() -> None:
        connection, work = Connection(), Work()
        handler = asyncio.ensure_future(until_disconnect(*request_on(connection), work.run()))
        await asyncio.sleep(0.01)
        handler.cancel()  # a shutdown, say
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert work.cancelled

    asyncio.run(main())


def test_under_another_server_the_disconnect_message_cancels_the_work() -> None:
    async def main() -> None:
        work = Work()

        async def receive() -> Message:
            await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        with pytest.raises(ClientGone):
            await until_disconnect(*request_on(None, receive), work.run())
        assert work.cancelled

    asyncio.run(main())
