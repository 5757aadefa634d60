"""A failed request, logged once and in one line: what every front end does with an error it
answers as a server fault (HTTP 500, gRPC INTERNAL).

An error the agent classified (its domain's, or a backend's translated at the boundary: a
model that fails on its input) is one line with its code and message; it is the model's
fault, not the agent's, and a bad version failing every request would otherwise write a
traceback per request. An error nobody classified is a bug: its traceback is logged, once a
minute for each distinct error, and the repeats in between are one line each.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agent.serving.errors import error_code

TRACEBACK_EVERY_S = 60.0
_MAX_REMEMBERED = 256


class FailureLog:
    """Where a front end logs the requests it answers as a server fault."""

    def __init__(self, log: logging.Logger, clock: Any = time.monotonic) -> None:
        self.log = log
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}

    def failed(self, message: str, exc: BaseException, **extra: object) -> None:
        code = error_code(exc) if isinstance(exc, Exception) else "internal"
        fields = {"code": code, "error": f"{type(exc).__name__}: {exc}"[:1000], **extra}
        if code != "internal":
            self.log.error(message, extra=fields)
            return
        key = (type(exc).__name__, str(exc)[:200])
        now = self._clock()
        if now - self._last.get(key, -TRACEBACK_EVERY_S) < TRACEBACK_EVERY_S:
            self.log.error(message, extra=fields | {"traceback": "logged in the last minute"})
            return
        if len(self._last) >= _MAX_REMEMBERED:
            self._last.clear()
        self._last[key] = now
        self.log.error(message, exc_info=exc, extra=fields)
