"""uvicorn's server as both processes run it: SIGTERM is a clean exit, and an optional
notifier (the agent's sd_notify) hears the serving loop's ticks and the start of shutdown."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Protocol

import uvicorn


class Notifier(Protocol):
    def tick(self) -> None:
        """Called from the serving loop about every 0.1 s once it serves."""

    def stopping(self) -> None:
        """Called once when shutdown begins."""


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, notifier: Notifier | None = None) -> None:
        super().__init__(config)
        self.notifier = notifier

    async def on_tick(self, counter: int) -> bool:
        if self.notifier is not None:
            self.notifier.tick()  # READY=1 and the watchdog, from the serving loop itself
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.notifier is not None:
            self.notifier.stopping()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Handle SIGINT/SIGTERM as uvicorn does, without raising the signal again afterwards:
        uvicorn re-raises it so the process dies by the signal, but a clean shutdown on SIGTERM
        is a success (exit 0) for systemd and Kubernetes."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {
            sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
