"""Structured logs: one JSON object per line on stderr and, where a file is given, in a
bounded set of rotating files (the agent keeps its recent lines there, to answer a remote
log request: docs/operations.md, "Seeing a device's logs")."""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
from collections.abc import Iterable
from pathlib import Path

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

LOG_FILE_BACKUPS = 3
"""Rotated files kept beside the current one: the files hold at most 4x ``file_max_bytes``."""
REDACTED = "[redacted]"


class RedactingFormatter(JsonFormatter):
    """JSON lines in which each of ``secrets`` (a password, a token) reads ``[redacted]``,
    wherever a message or an extra field carried it."""

    def __init__(self, *args: object, secrets: Iterable[str] = (), **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        found = {s for s in secrets if len(s) >= 4}
        # as written, and as JSON escapes it inside a string
        self.secrets = sorted(found | {json.dumps(s)[1:-1] for s in found}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        for secret in self.secrets:
            line = line.replace(secret, REDACTED)
        return line


def configure_logging(
    level: str,
    *,
    file: Path | None = None,
    file_max_bytes: int = 1024 * 1024,
    secrets: Iterable[str] = (),
) -> None:
    """``file``: also write the lines there, rotated at ``file_max_bytes`` with
    :data:`LOG_FILE_BACKUPS` older files kept. ``secrets``: values no line may carry."""
    formatter = RedactingFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
        reserved_attrs=[*RESERVED_ATTRS, "color_message"],
        secrets=secrets,
    )
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        rotating = logging.handlers.RotatingFileHandler(
            file, maxBytes=file_max_bytes, backupCount=LOG_FILE_BACKUPS, encoding="utf-8"
        )
        rotating.setFormatter(formatter)
        root.addHandler(rotating)
    root.setLevel(level.upper())
    # uvicorn's own access log would duplicate ours, in plain text
    logging.getLogger("uvicorn.access").disabled = True
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
