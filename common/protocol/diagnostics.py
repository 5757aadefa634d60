"""A device's logs and support bundle on the wire (docs/operations.md, "Seeing a device's
logs").

An operator's request is a signed :class:`~common.protocol.messages.Command` of type ``logs``
or ``support-bundle`` on the device's commands topic. The device answers on its telemetry
topic (the only one it may publish data to) with :class:`DiagnosticUpload` chunks, told apart
from telemetry by their ``kind``: one chunk in flight at a time, at most
:data:`MAX_CHUNK_BYTES` each, the whole at most :data:`MAX_DIAGNOSTIC_BYTES`. The control plane
appends a chunk whose ``offset`` is the length it holds (ignoring any other) and answers on the
device's acks topic with a :class:`DiagnosticAck` naming the bytes it holds; the device sends
the chunk from there, again after a reconnect or a while: resumable, and stored once.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_DIAGNOSTIC_BYTES = 4 * 1024 * 1024
"""The most one answer (logs or bundle) may hold, whatever the request's ``max_bytes``."""
DEFAULT_LOG_BYTES = 256 * 1024
"""A log request's ``max_bytes`` when it names none: the newest lines that fit."""
MAX_CHUNK_BYTES = 96 * 1024
"""Answer bytes in one upload (base64 on the wire: 4/3 of it)."""
_B64_MAX = (MAX_CHUNK_BYTES + 2) // 3 * 4


class LogLevel(StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


class DiagnosticUpload(BaseModel):
    """Device to fleet, on the device's telemetry topic (QoS 1): a chunk of the answer to
    command ``request_id``, or (``error`` set, no data) why there is none."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    kind: Literal["diagnostic"] = "diagnostic"
    device_id: str
    request_id: str = Field(min_length=1, max_length=128)
    """The command's ``command_id``."""
    offset: int = Field(ge=0, le=MAX_DIAGNOSTIC_BYTES)
    total_bytes: int = Field(ge=0, le=MAX_DIAGNOSTIC_BYTES)
    """The whole answer's size: complete once the control plane holds this many bytes."""
    data_b64: str = Field(default="", max_length=_B64_MAX)
    error: str = Field(default="", max_length=500)
    """Why the device cannot answer (the request is then failed)."""


class DiagnosticAck(BaseModel):
    """Fleet to device, on the device's acks topic (QoS 1): the bytes of ``request_id`` the
    control plane holds; the device sends the next chunk from there, or is done."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    kind: Literal["diagnostic-ack"] = "diagnostic-ack"
    device_id: str
    request_id: str = Field(min_length=1, max_length=128)
    received_bytes: int = Field(ge=0, le=MAX_DIAGNOSTIC_BYTES)
    done: bool = False
    """The control plane holds the whole answer (or failed it): nothing more to send."""
