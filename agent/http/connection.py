"""What the agent's HTTP protocol hands the application through a request's scope.

The protocol (:mod:`agent.http.protocol`) puts a request's :class:`Connection`, its
uvicorn cycle and the server's refusal counter in its scope, under the keys here, and calls a
:class:`DirectApp` from its callbacks. The application's side (:mod:`agent.http.transport`,
:mod:`agent.api.errors`, :mod:`agent.api.fastpath`) needs only these names: kept apart from
the protocol, they import nothing of uvicorn's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from starlette.types import Scope

CONNECTION_KEY = "edgefleet.connection"
"""Scope key of the request's :class:`Connection`."""
CYCLE_KEY = "edgefleet.cycle"
"""Scope key of the request's uvicorn cycle, for :func:`agent.http.answers.respond`."""
REFUSED_KEY = "edgefleet.refused"
"""Scope key of the server's refusal counter, ``(RefusalReason) -> None``, for the refusals
the application makes (:func:`agent.api.errors.count_refusal`)."""


class Connection:
    """What a handler may ask of its connection: call back when the client is gone.

    A handler waiting for a result registers a callback instead of running a task per request
    that waits for ``http.disconnect``.
    """

    __slots__ = ("lost", "_callbacks")

    def __init__(self) -> None:
        self.lost = False
        self._callbacks: list[Callable[[], object]] = []

    def on_lost(self, callback: Callable[[], object]) -> None:
        self._callbacks.append(callback)

    def forget(self, callback: Callable[[], object]) -> None:
        self._callbacks.remove(callback)

    def lose(self) -> None:
        """The protocol's side: the client is gone; each callback is called once."""
        self.lost = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class DirectApp(Protocol):
    """An app that answers some requests from the connection's callbacks, without an ASGI
    task: the ASGI app uvicorn runs names it ``direct_app``."""

    def takes(self, scope: Scope) -> bool:
        """Whether :meth:`start` answers this request (asked once its head is parsed)."""

    def start(self, scope: Scope, body: bytes, tasks: set[Any]) -> None:
        """Answer the request, whose body is complete; never raises. Its own futures and
        tasks join ``tasks``, uvicorn's, which a shutdown waits for."""
