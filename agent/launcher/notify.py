"""sd_notify(3) on both sides of the launcher: a datagram socket of its own that the agent's
notifier (agent/systemd.py) talks to as if it were systemd, and the service manager's
socket upstream, which hears READY=1 once the launcher's agent is ready and WATCHDOG=1 from
the launcher's own loop.

NOTE: the protocol is described in sd_notify(3):
https://www.freedesktop.org/software/systemd/man/latest/sd_notify.html
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from collections.abc import MutableMapping
from pathlib import Path

log = logging.getLogger("edgefleet.launcher")

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def notify_address(value: str) -> str | None:
    """The socket address of ``NOTIFY_SOCKET``: a path, or ``@name`` for the abstract
    namespace (a leading NUL byte). Other forms (``vsock:``) are not supported here."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def parse(datagram: bytes) -> dict[str, str]:
    """``KEY=value`` lines; lines without ``=`` are ignored, as systemd does."""
    lines = datagram.decode("utf-8", "replace").splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


class NotifySocket:
    """The launcher's own notify socket, at a path its agent gets as ``NOTIFY_SOCKET``."""

    def __init__(self, path: Path) -> None:
        if len(os.fsencode(path)) > 107:  # sun_path's size on Linux, with its NUL
            raise OSError(f"notify socket path too long for AF_UNIX: {path}")
        path.unlink(missing_ok=True)  # a socket a killed launcher left
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(str(path))
        os.chmod(path, 0o600)
        # the kernel attaches the sender's pid to each datagram: only the agent's count
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.setblocking(False)

    def receive(self) -> list[tuple[int | None, dict[str, str]]]:
        """Every datagram waiting: the sender's pid (None if the kernel gave none), parsed."""
        found: list[tuple[int | None, dict[str, str]]] = []
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
            except BlockingIOError:
                return found
            pid = None
            for level, kind, value in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _UCRED.unpack(value[: _UCRED.size])[0]
            found.append((pid, parse(data)))

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


class Upstream:
    """The service manager above the launcher (systemd's ``Type=notify``), or nobody."""

    def __init__(self, address: str | None, watchdog_usec: int | None) -> None:
        self.address = address
        self.interval_s = watchdog_usec / 2e6 if address and watchdog_usec else None
        self.ready_sent = False
        self._next_ping = time.monotonic()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str]) -> Upstream:
        """Take (and unset, so the agent never talks to systemd itself) systemd's variables."""
        raw = environ.pop("NOTIFY_SOCKET", "")
        usec = environ.pop("WATCHDOG_USEC", "")
        pid = environ.pop("WATCHDOG_PID", "")
        watchdog = int(usec) if usec.isdigit() and int(usec) > 0 else None
        if pid and pid != str(os.getpid()):
            watchdog = None
        return cls(notify_address(raw) if raw else None, watchdog)

    def send(self, *assignments: str) -> None:
        if self.address is None:
            return
        try:
            self._sock.sendto("\n".join(assignments).encode(), self.address)
        except OSError as exc:
            log.warning("sd_notify failed", extra={"error": str(exc), "sent": assignments})

    def ready(self, status: str) -> None:
        if not self.ready_sent:
            self.ready_sent = True
            self.send("READY=1", f"STATUS={status}")
        else:
            self.send(f"STATUS={status}")

    def next_due(self) -> float | None:
        """When the next watchdog ping is due (``time.monotonic()``), or None."""
        return self._next_ping if self.interval_s is not None else None

    def tick(self) -> None:
        if self.interval_s is not None and time.monotonic() >= self._next_ping:
            self._next_ping = time.monotonic() + self.interval_s
            self.send("WATCHDOG=1")
