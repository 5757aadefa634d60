"""Captured samples on the wire: a device's spooled requests and answers, uploaded for
retraining (docs/model-quality.md, "Data capture").

A device may publish only to its own status, telemetry and events topics, so samples ride
the telemetry topic as a :class:`CaptureUpload` (told apart from :class:`Telemetry` by its
``kind``: :func:`parse_device_telemetry`), a few at a time and at most
:data:`MAX_UPLOAD_BYTES` of sample data per message. The control plane stores each by
(device, ``sample_id``), ignoring one it holds already, and answers on the device's acks topic
with a :class:`CaptureAck` naming the samples stored; the device deletes a sample from its
spool only then, and sends the rest again after a reconnect or a while: at least once on the
wire, exactly once in the store.

A sample's tensors travel as one ``.npz`` archive (NumPy's zip of ``.npy`` files, compressed,
no pickles), base64 in JSON: ``input:NAME`` and ``output:NAME`` arrays.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter

from common.protocol.diagnostics import DiagnosticAck, DiagnosticUpload
from common.protocol.messages import Telemetry, TelemetryAck

MAX_SAMPLE_BYTES = 192 * 1024
"""The most one sample's archive may hold: one sample always fits one message."""
MAX_UPLOAD_BYTES = 256 * 1024
"""Sample data in one upload, base64 (a sample alone may reach 4/3 of MAX_SAMPLE_BYTES)."""
MAX_UPLOAD_SAMPLES = 16
"""Samples in one upload at most."""
MAX_ACKED_SAMPLES = 1024
"""Sample ids in one acknowledgement."""
_B64_MAX = (MAX_SAMPLE_BYTES + 2) // 3 * 4


class CaptureTrigger(StrEnum):
    """Why a sample was captured."""

    SAMPLED = "sampled"
    """Drawn by the policy's ``sample_rate``."""
    LOW_CONFIDENCE = "low_confidence"
    """Its rows' top-1 probability was below the policy's ``low_confidence_below``."""
    SHADOW_DISAGREEMENT = "shadow_disagreement"
    """The staged shadow candidate's top-1 differed from the served answer."""


class CapturedSample(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sample_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    """Unique per device (a UUID's hex): the control plane stores a sample once by it."""
    model: str = Field(min_length=1, max_length=128)
    version: int = Field(ge=1)
    captured_at: datetime
    trigger: CaptureTrigger
    rows: int = Field(ge=0)
    data_b64: str = Field(max_length=_B64_MAX)
    """The ``.npz`` archive of the sample's tensors, base64."""


class CaptureUpload(BaseModel):
    """Device to fleet, on the device's telemetry topic (QoS 1): spooled samples."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    kind: Literal["capture"] = "capture"
    device_id: str
    samples: list[CapturedSample] = Field(min_length=1, max_length=MAX_UPLOAD_SAMPLES)


class CaptureAck(BaseModel):
    """Fleet to device, on the device's acks topic (QoS 1): the samples stored (or stored
    before); the device deletes them from its spool."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    kind: Literal["capture-ack"] = "capture-ack"
    device_id: str
    sample_ids: list[str] = Field(min_length=1, max_length=MAX_ACKED_SAMPLES)


def _kind(default: str) -> Any:
    def tag(value: Any) -> str:
        if isinstance(value, dict):
            return str(value.get("kind", default))
        return str(getattr(value, "kind", default))

    return tag


DeviceTelemetry = TypeAdapter[Telemetry | CaptureUpload | DiagnosticUpload](
    Annotated[
        Annotated[Telemetry, Tag("telemetry")]
        | Annotated[CaptureUpload, Tag("capture")]
        | Annotated[DiagnosticUpload, Tag("diagnostic")],
        Discriminator(_kind("telemetry")),
    ]
)
"""What a telemetry topic carries: a window's telemetry (no ``kind``), an upload of samples,
or a chunk of logs or a support bundle."""
FleetAck = TypeAdapter[TelemetryAck | CaptureAck | DiagnosticAck](
    Annotated[
        Annotated[TelemetryAck, Tag("telemetry-ack")]
        | Annotated[CaptureAck, Tag("capture-ack")]
        | Annotated[DiagnosticAck, Tag("diagnostic-ack")],
        Discriminator(_kind("telemetry-ack")),
    ]
)
"""What an acks topic carries: telemetry seqs stored (no ``kind``), samples stored, or the
bytes of a diagnostic answer held."""
