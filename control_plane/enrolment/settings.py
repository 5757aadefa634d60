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
    admit_rate_per_s: float = Field(default=200.0, gt=0)
    """Enrolment requests admitted per second on average (a token bucket); beyond it, 429 with
    a ``Retry-After`` that spreads the refused devices at this rate."""
    admit_burst_requests: int = Field(default=400, ge=1)
    """Requests admitted at once before the rate applies (the bucket's size)."""
    max_in_flight_requests: int = Field(default=16, ge=1)
    """Enrolment requests being answered at once; beyond it, 429. Below the database pool's
    20 connections: at 128, 5,000 devices at once left requests waiting 30 s for a connection
    and failing (benchmarks/fleet/enrolment.py)."""
    max_retry_after_s: float = Field(default=300.0, ge=1)
    """The longest ``Retry-After`` a refused device is told."""
