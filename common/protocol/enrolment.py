"""Zero-touch provisioning on the wire: what a device that holds a claim token sends to the
control plane's ``POST /api/v1/enrol`` (the token itself in ``Authorization: Bearer``, checked
before the body is read), and the answer. A refusal is an HTTP error (401, 403, 409) whose JSON
body is ``{"error": message, "code": ..., "reason": ...}``, the reason one of
``control_plane.db.states.Refusal``."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ENROL_PATH = "/api/v1/enrol"


class EnrolmentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    device_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    device_key: str = Field(min_length=32, max_length=256)
    """A secret the device made at its first request and keeps: only it may collect the
    identity of this device id (asking again while pending, or after losing what it got)."""
    hardware_profile: str = Field(min_length=1, max_length=128)
    labels: dict[str, str] = Field(default_factory=dict)
    agent_version: str = Field(default="", max_length=64)


class EnrolmentStatus(StrEnum):
    PENDING = "pending"
    """An operator has to approve the device: ask again after ``retry_after_s``."""
    ENROLLED = "enrolled"
    """The answer carries the device's broker identity and the trust root."""


class EnrolmentAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    device_id: str
    status: EnrolmentStatus
    retry_after_s: float | None = None
    username: str | None = None
    """The device's broker user (its device id)."""
    password: str | None = None
    """Its broker password: shown in this answer only; asking again issues a new one."""
    topic_prefix: str | None = None
    trust_root: dict[str, Any] | None = None
    """The signed trust root envelope: the keys its manifests must be signed with."""
