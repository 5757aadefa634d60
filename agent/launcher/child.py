"""One run of the agent as the launcher's child process, and the waits on it.

The launcher waits on file descriptors only, in one ``selectors`` loop: a pidfd (the child
exited), the notify socket (READY=1, WATCHDOG=1), the child's stderr (copied through to the
launcher's, its last lines kept for the reason of a failure) and a wake-up socket for
signals. No sleep-polling: a wait ends on the first event or at its deadline.
"""

from __future__ import annotations

import ctypes
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping
from enum import StrEnum

from agent.launcher.notify import NotifySocket, Upstream

log = logging.getLogger("edgefleet.launcher")

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_TAIL_LINES = 20


class Wake(StrEnum):
    READY = "ready"
    EXITED = "exited"
    TIMEOUT = "timeout"
    SIGNAL = "signal"
    SILENT = "silent"
    """The agent's watchdog pings stopped (``child_watchdog_s``)."""


class Signals:
    """SIGTERM, SIGINT and SIGHUP, turned into a readable socket for the selector."""

    HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        for end in (self.reader, self._writer):
            end.setblocking(False)
        self.received: list[int] = []
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for signum in self.HANDLED:
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: object) -> None:
        self.received.append(signum)

    def drain(self) -> None:
        try:
            while self.reader.recv(512):
                pass
        except BlockingIOError:
            pass

    def take(self) -> list[int]:
        found, self.received = self.received, []
        return found

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        for signum in self.HANDLED:
            signal.signal(signum, signal.SIG_DFL)
        self.reader.close()
        self._writer.close()


def _die_with(parent: int) -> None:
    """In the child before exec: SIGKILL when the launcher dies, even by kill -9, so an
    orphaned agent never holds the port while the restarted launcher starts another."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)


class Child:
    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        notify: NotifySocket,
        signals: Signals,
        upstream: Upstream,
        watchdog_s: float = 0.0,
    ) -> None:
        parent = os.getpid()
        self.proc = subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: _die_with(parent),  # the launcher runs no threads
        )
        self.pid = self.proc.pid
        self.pidfd = os.pidfd_open(self.pid)
        self.started = time.monotonic()
        self.ready = False
        self.returncode: int | None = None
        self.tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._partial = b""
        self._notify, self._signals, self._upstream = notify, signals, upstream
        self._watchdog_s = watchdog_s
        self._last_ping = self.started
        assert self.proc.stderr is not None
        os.set_blocking(self.proc.stderr.fileno(), False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.pidfd, selectors.EVENT_READ, "exit")
        self._selector.register(self.proc.stderr, selectors.EVENT_READ, "stderr")
        self._selector.register(notify.sock, selectors.EVENT_READ, "notify")
        self._selector.register(signals.reader, selectors.EVENT_READ, "signal")

    def wait(self, until: float | None) -> Wake:
        """Until the agent gets ready (the first time), exits, falls silent, a signal
        arrives, or ``until`` (``time.monotonic()``) passes."""
        while True:
            now = time.monotonic()
            deadlines = [d for d in (until, self._upstream.next_due(), self._silent_at()) if d]
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            for key, _ in self._selector.select(timeout):
                wake = self._handle(key.data)
                if wake is not None:
                    return wake
            self._upstream.tick()
            now = time.monotonic()
            silent_at = self._silent_at()
            if silent_at is not None and now >= silent_at:
                return Wake.SILENT
            if until is not None and now >= until:
                return Wake.TIMEOUT

    def _silent_at(self) -> float | None:
        if not self._watchdog_s or not self.ready:
            return None
        return self._last_ping + self._watchdog_s

    def _handle(self, source: str) -> Wake | None:
        if source == "exit":
            self._read_stderr()  # a traceback written before the exit is in the pipe
            self.returncode = self.proc.wait()
            self._selector.unregister(self.pidfd)
            return Wake.EXITED
        if source == "stderr":
            self._read_stderr()
        elif source == "notify":
            for sender, fields in self._notify.receive():
                if sender != self.pid:  # NOTE: NotifyAccess=main, as systemd's default
                    log.warning("notify message not from the agent ignored", extra={"pid": sender})
                    continue
                if fields.get("WATCHDOG") == "1":
                    self._last_ping = time.monotonic()
                if fields.get("READY") == "1" and not self.ready:
                    self.ready = True
                    self._last_ping = time.monotonic()
                    return Wake.READY
        elif source == "signal":
            self._signals.drain()
            if self._signals.received:
                return Wake.SIGNAL
        return None

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while not self.proc.stderr.closed:
            try:
                chunk = os.read(self.proc.stderr.fileno(), 65536)
            except BlockingIOError:
                return
            if not chunk:
                self._selector.unregister(self.proc.stderr)
                self.proc.stderr.close()
                return
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            self.tail.extend(line.decode("utf-8", "replace") for line in lines if line.strip())

    def last_line(self) -> str:
        """The last line the agent wrote on stderr (a traceback's ends with the error)."""
        if self._partial.strip():
            return self._partial.decode("utf-8", "replace")[:300]
        return self.tail[-1][:300] if self.tail else ""

    def stop(self, grace_s: float) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit status."""
        if self.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.returncode is None:
                wake = self.wait(deadline)
                if wake is Wake.TIMEOUT:
                    self.proc.kill()
                    deadline = time.monotonic() + grace_s
        self.close()
        assert self.returncode is not None
        return self.returncode

    def close(self) -> None:
        self._read_stderr()
        self._selector.close()
        os.close(self.pidfd)
