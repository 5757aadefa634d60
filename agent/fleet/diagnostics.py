"""A device's logs and support bundle, answered to the fleet's signed request
(:mod:`common.protocol.diagnostics`; docs/operations.md, "Seeing a device's logs").

The agent's log lines are kept in ``state_dir/logs/agent.jsonl`` and 3 rotated files
(``log_file_max_bytes`` each): a log request reads them, oldest file first, keeps the lines in
its time range and at or above its level, and sends the newest that fit its ``max_bytes``. A
support bundle is one JSON document: the settings with every secret ``[redacted]``, the
versions served, the recent update events, the Prometheus text and the outbox's state, and
the newest log lines. Whatever is sent is scrubbed once more of every secret the agent
knows (its broker password, claim token, API key), as written and as JSON escapes it.

One answer is uploaded at a time, one chunk in flight: a chunk not acknowledged within
``telemetry_resend_s``, or in flight at a reconnect, is sent again from the offset the
control plane acknowledged last. Requests wait in memory (at most :data:`MAX_QUEUED`): an
agent restart loses the one under way, which the control plane then shows as pending until
it expires.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

from common.logs import LOG_FILE_BACKUPS, REDACTED
from common.protocol.diagnostics import (
    DEFAULT_LOG_BYTES,
    MAX_CHUNK_BYTES,
    MAX_DIAGNOSTIC_BYTES,
    DiagnosticAck,
    DiagnosticUpload,
)
from common.protocol.messages import Command, CommandType

log = logging.getLogger("edgefleet.agent.fleet")

MAX_QUEUED = 8
"""Requests waiting behind the one being uploaded; more are answered with an error."""
_RANKS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
_SECRET_NAMES = ("password", "token", "secret", "api_key", "private_key")


def log_file(state_dir: Path) -> Path:
    return state_dir / "logs" / "agent.jsonl"


def secret_values(model: BaseModel) -> list[str]:
    """Every SecretStr's value in ``model`` and the models it holds."""
    found: list[str] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, SecretStr):
            found.append(value.get_secret_value())
        elif isinstance(value, BaseModel):
            found += secret_values(value)
    return found


def redacted(model: BaseModel) -> dict[str, Any]:
    """``model`` as JSON, each secret (a SecretStr, or a field named like one) ``[redacted]``."""

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, SecretStr) or (
            isinstance(value, str) and value and any(n in key.lower() for n in _SECRET_NAMES)
        ):
            return REDACTED
        if isinstance(value, BaseModel):
            return {k: walk(getattr(value, k), k) for k in type(value).model_fields}
        if isinstance(value, dict):
            return {str(k): walk(v, str(k)) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [walk(v) for v in value]
        if isinstance(value, str | int | float | bool) or value is None:
            return value
        return str(value)

    out: dict[str, Any] = walk(model)
    return out


def scrub(data: bytes, secrets: Iterable[str]) -> bytes:
    """``data`` with every secret (as written and JSON-escaped) ``[redacted]``."""
    found = {s for s in secrets if len(s) >= 4}
    for secret in sorted(found | {json.dumps(s)[1:-1] for s in found}, key=len, reverse=True):
        data = data.replace(secret.encode(), REDACTED.encode())
    return data


def read_logs(
    path: Path,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    min_level: str | None = None,
    max_bytes: int = DEFAULT_LOG_BYTES,
) -> bytes:
    """The newest JSON lines of ``path`` and its rotated files that match and fit."""
    files = [path.with_name(f"{path.name}.{i}") for i in range(LOG_FILE_BACKUPS, 0, -1)]
    rank = _RANKS.get(min_level or "DEBUG", 10)
    kept: deque[bytes] = deque()
    size = 0
    for f in [*files, path]:
        try:
            lines = f.read_bytes().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            if not _matches(line, since, until, rank):
                continue
            kept.append(line + b"\n")
            size += len(line) + 1
            while size > max_bytes:
                size -= len(kept.popleft())
    return b"".join(kept)


def _matches(line: bytes, since: datetime | None, until: datetime | None, rank: int) -> bool:
    try:
        record = json.loads(line)
        at = datetime.fromisoformat(record["time"])
    except (ValueError, KeyError, TypeError):
        return False
    if _RANKS.get(str(record.get("level")), 0) < rank:
        return False
    return (since is None or at >= since) and (until is None or at <= until)


@dataclass(frozen=True)
class BundleSources:
    config: dict[str, Any]
    """The settings a support bundle shows, redacted (:func:`redacted`)."""
    secrets: tuple[str, ...]
    """Values no answer may carry (:func:`secret_values` of the agent's settings)."""


@dataclass
class _Answer:
    request_id: str
    data: bytes
    error: str = ""
    acked: int = 0
    due: float | None = None
    """When the chunk in flight is due again (monotonic); None: none in flight."""


Build = Callable[[Command], Awaitable[bytes]]


class DiagnosticUploader:
    """The queue of requests and the upload of their answers, one chunk in flight."""

    def __init__(self, device_id: str, resend_s: float, build: Build) -> None:
        self.device_id = device_id
        self.resend_s = resend_s
        self.build = build
        self._requests: deque[Command] = deque()
        self._answer: _Answer | None = None
        self.wake = asyncio.Event()

    def request(self, command: Command) -> None:
        if len(self._requests) >= MAX_QUEUED:
            log.warning(
                "diagnostic request refused: too many queued",
                extra={"command_id": command.command_id},
            )
            self._requests.append(command.model_copy(update={"max_bytes": 0}))
        else:
            self._requests.append(command)
        self.wake.set()

    def reconnected(self) -> None:
        if self._answer is not None:
            self._answer.due = None

    async def next_upload(self, now: float) -> DiagnosticUpload | None:
        answer = self._answer
        if answer is None and self._requests:
            answer = self._answer = await self._start(self._requests.popleft())
        if answer is None or (answer.due is not None and answer.due > now):
            return None
        chunk = answer.data[answer.acked : answer.acked + MAX_CHUNK_BYTES]
        answer.due = now + self.resend_s
        return DiagnosticUpload(
            device_id=self.device_id,
            request_id=answer.request_id,
            offset=answer.acked,
            total_bytes=len(answer.data),
            data_b64=base64.b64encode(chunk).decode(),
            error=answer.error,
        )

    async def _start(self, command: Command) -> _Answer:
        if command.max_bytes == 0:
            return _Answer(command.command_id, b"", "too many diagnostic requests queued")
        try:
            data = await self.build(command)
        except OSError as exc:
            return _Answer(command.command_id, b"", f"{type(exc).__name__}: {exc}"[:500])
        if len(data) > MAX_DIAGNOSTIC_BYTES:
            why = f"the answer's {len(data)} bytes exceed {MAX_DIAGNOSTIC_BYTES}"
            return _Answer(command.command_id, b"", why)
        log.info(
            "diagnostic answer ready",
            extra={
                "command_id": command.command_id,
                "type": command.type.value,
                "bytes": len(data),
            },
        )
        return _Answer(command.command_id, data)

    def next_due_s(self, now: float) -> float | None:
        """Seconds until the chunk in flight is due again; None: nothing to wait for."""
        answer = self._answer
        if answer is None or answer.due is None:
            return None
        return max(0.0, answer.due - now)

    def acknowledged(self, ack: DiagnosticAck) -> None:
        answer = self._answer
        if answer is None or ack.request_id != answer.request_id:
            return  # a late acknowledgement of an answer done with
        if ack.done or ack.received_bytes >= len(answer.data) and not answer.error:
            self._answer = None
        else:
            answer.acked = max(answer.acked, min(ack.received_bytes, len(answer.data)))
            answer.due = None
        self.wake.set()


def is_diagnostic(command: Command) -> bool:
    return command.type in (CommandType.LOGS, CommandType.SUPPORT_BUNDLE)


def bundle_bytes(parts: dict[str, Any], logs: bytes) -> bytes:
    """The bundle's JSON document: ``parts`` and then the log lines (the part that grows)."""
    records = [json.loads(line) for line in logs.splitlines() if line.strip()]
    return json.dumps({**parts, "logs": records}, indent=1, default=str).encode()


async def fitted_bundle(
    parts: dict[str, Any], logs: Callable[[int], Awaitable[bytes]], max_bytes: int
) -> bytes:
    """The bundle with as many of the newest log lines as keep it within ``max_bytes``
    (lines grow in the document by their indentation: the budget shrinks until it fits).
    Without logs and still over: as it is (the control plane then fails the request)."""
    budget = max_bytes - len(bundle_bytes(parts, b""))
    while budget > 256:
        data = bundle_bytes(parts, await logs(budget))
        if len(data) <= max_bytes:
            return data
        budget = budget * 3 // 4
    return bundle_bytes(parts, b"")
