"""sd_notify(3) for ``Type=notify`` units, in the standard library only.

systemd hands a service two things in its environment: ``NOTIFY_SOCKET``, an ``AF_UNIX``
datagram socket (a path, or ``@name`` in the abstract namespace), and, with ``WatchdogSec=``,
``WATCHDOG_USEC`` (and ``WATCHDOG_PID``). The agent sends:

- ``READY=1`` once the server accepts connections and the start-up load of the model
  repository has finished (whether every model loaded or not: readiness for traffic is the
  HTTP probe's business; holding back ``READY=1`` would make systemd kill an agent that is
  serving the models it could load), with a ``STATUS=`` line saying how many models serve;
- ``WATCHDOG=1`` every half of ``WATCHDOG_USEC``, from the event loop itself, so a blocked
  loop stops the pings and systemd restarts the agent;
- ``STOPPING=1`` when shutdown begins.

NOTE: the protocol and the variables are described in sd_notify(3) and sd_watchdog_enabled(3):
https://www.freedesktop.org/software/systemd/man/latest/sd_notify.html
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import MutableMapping

from agent.serving.state import ServingState

log = logging.getLogger("edgefleet.agent")


def notify_address(value: str) -> str | None:
    """The socket address of ``NOTIFY_SOCKET``: a path, or ``@name`` for the abstract
    namespace (a leading NUL byte). Other forms (``vsock:``) are not supported here."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


class SystemdNotifier:
    """Sends state changes to the service manager over its notify socket."""

    def __init__(self, address: str, state: ServingState, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.state = state
        self.watchdog_interval_s = watchdog_usec / 2e6 if watchdog_usec else None
        """Half of the watchdog timeout, as sd_watchdog_enabled(3) recommends."""
        self.ready_sent = False
        self._next_ping = time.monotonic()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        # A full receive queue on systemd's side must never stall the event loop.
        self._sock.setblocking(False)

    @classmethod
    def from_environment(
        cls, environ: MutableMapping[str, str], state: ServingState
    ) -> SystemdNotifier | None:
        """A notifier when the process runs under a ``Type=notify`` unit, else None.

        The variables are removed from ``environ`` (as ``sd_notify(unset_environment=1)``
        does) so that no child process the agent may start talks to systemd in its name.
        """
        raw = environ.pop("NOTIFY_SOCKET", "")
        usec = environ.pop("WATCHDOG_USEC", "")
        pid = environ.pop("WATCHDOG_PID", "")
        if not raw:
            return None
        address = notify_address(raw)
        if address is None:
            log.warning("unsupported NOTIFY_SOCKET, not notifying systemd", extra={"value": raw})
            return None
        watchdog_usec = int(usec) if usec.isdigit() and int(usec) > 0 else None
        if pid and pid != str(os.getpid()):
            watchdog_usec = None  # the watchdog is meant for another process
        return cls(address, state, watchdog_usec)

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines in one datagram; False (and a log line) if it failed."""
        try:
            self._sock.sendto("\n".join(assignments).encode(), self.address)
        except OSError as exc:
            log.warning("sd_notify failed", extra={"error": str(exc), "sent": assignments})
            return False
        return True

    def status(self) -> str:
        models = self.state.manager.models.values()
        serving = sum(1 for e in models if e.served)
        word = "ready" if self.state.ready() else "not ready"
        return f"{word}: {serving} of {len(models)} models serving"

    def tick(self) -> None:
        """Called on every tick of the server's event loop (uvicorn's, every 0.1 s)."""
        if not self.ready_sent and self.state.loaded:
            self.ready_sent = True  # once: a failed send is logged, not retried every tick
            self.send("READY=1", f"STATUS={self.status()}")
        if self.watchdog_interval_s is not None and time.monotonic() >= self._next_ping:
            self._next_ping = time.monotonic() + self.watchdog_interval_s
            self.send("WATCHDOG=1")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=shutting down")
        self.close()

    def close(self) -> None:
        self._sock.close()
