"""A request's regions held for as long as its answer is awaited, whoever awaits it.

gRPC awaits its answer in one coroutine and releases its lease in a ``finally``. REST's answer
is a future that more than one caller waits on (the handler's task, or the connection's
callback in :mod:`agent.api.fastpath`, which may drop it when the client goes): there the
lease is tied to the future instead. :func:`hold_until_answered` gives the caller a future of
its own, resolved only once the outputs are written into their regions, and releases the
lease however the request ends: answered, failed, or dropped by its caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from agent.shm.regions import Lease

T = TypeVar("T")


def hold_until_answered(
    answer: asyncio.Future[T], lease: Lease, write: Callable[[T], None]
) -> asyncio.Future[T]:
    """A future resolved with ``answer``'s result once ``write(result)`` has put the outputs
    into their regions and no region was unregistered meanwhile.

    ``write``'s error (:class:`agent.shm.regions.RegionGoneError` among them) becomes the
    future's. Cancelling the returned future cancels ``answer`` (which drops the request
    from its batcher). The lease is released when both are done.
    """
    held: asyncio.Future[T] = answer.get_loop().create_future()

    def answered(_: asyncio.Future[T]) -> None:
        try:
            if held.done():  # dropped by its caller
                return
            if answer.cancelled():
                held.cancel()
                return
            error = answer.exception()
            if error is not None:
                held.set_exception(error)
                return
            result = answer.result()
            write(result)
            lease.check()  # a region taken away while the request ran fails it, inputs' too
        except Exception as exc:
            held.set_exception(exc)
        else:
            held.set_result(result)
        finally:
            lease.release()

    def dropped(_: asyncio.Future[T]) -> None:
        if held.cancelled():
            answer.cancel()
            lease.release()  # now; answered() releases nothing more

    answer.add_done_callback(answered)
    held.add_done_callback(dropped)
    return held
