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
    model_config = ConfigDict(frozen=True, extra="forbid")

    accounts: AccountsKind = AccountsKind.PASSWORD_FILE
    """Where enrolled devices get their broker user."""
    pending_retry_s: float = Field(default=30.0, gt=0, le=3600)
    """What a pending device is told to wait before it asks again (its ``Retry-After``)."""
    admit_rate_per_s: float = Field(default=100.0, gt=0)
    """Enrolment requests admitted per second on average (a token bucket); beyond it, 429 with
    a ``Retry-After`` that spreads the refused devices at this rate, or at the rate requests
    are answered when that is slower. About what one control plane and a password-file broker
    provision per second on 2 shared cores (benchmarks/fleet/enrolment.py)."""
    admit_burst_requests: int = Field(default=500, ge=1)
    """Requests admitted at once before the rate applies (the bucket's size)."""
    max_in_flight_requests: int = Field(default=256, ge=1)
    """Enrolment requests being answered at once; beyond it, 429. Those in flight are answered
    in batches (a few statements and one database connection a batch), so this bounds memory
    and the answer's wait, not the database pool."""
    max_retry_after_s: float = Field(default=300.0, ge=1)
    """The longest ``Retry-After`` a refused device is told."""
    claim_check_cache_s: float = Field(default=10.0, ge=0)
    """How long a claim token found good is trusted by the check made before the body is read
    (revocation, expiry and uses are checked again with the body, uncached)."""
    max_batch_devices: int = Field(default=500, ge=1)
    """Devices admitted (or finished) in one transaction at most."""
    broker_reload_interval_s: float = Field(default=1.0, gt=0, le=60)
    """Password file: written, and the broker reloaded, at most once per interval; devices
    enrolling meanwhile share the next write. A reload rechecks every connected client."""
