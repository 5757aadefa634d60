"""Zero-touch provisioning's settings, nested in the control plane's as ``enrolment``
(``EDGEFLEET_CP_ENROLMENT__*``)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class AccountsKind(StrEnum):
    DYNSEC = "dynsec"
    """Mosquitto's dynamic security plugin, through ``$CONTROL`` (the control plane's broker
    user must administer it: see docs/enrolment.md)."""
    PASSWORD_FILE = "password_file"
    """The password file and ACL under the state directory (``edgefleet fleet``), written into
    the broker directory ``fleet init`` or ``mosquitto-config`` wrote, and reloaded."""


class EnrolmentSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    accounts: AccountsKind = AccountsKind.PASSWORD_FILE
    """Where enrolled devices get their broker user."""
    pending_retry_s: float = Field(default=30.0, gt=0, le=3600)
    """What a pending device is told to wait before it asks again (its ``Retry-After``)."""
