"""The states of a claim and of an enrolment, and the reasons a device is refused.

An enrolment::

    (claim presented) --> pending --approve--> approved --identity collected--> enrolled
                          pending --reject---> rejected
    (claim presented, no approval required) --> approved --> enrolled
"""

from __future__ import annotations

from enum import StrEnum


class ClaimState(StrEnum):
    ACTIVE = "active"
    EXPIRED = "expired"
    REVOKED = "revoked"
    USED_UP = "used_up"


class EnrolmentState(StrEnum):
    PENDING = "pending"
    """Waiting for an operator's approval."""
    APPROVED = "approved"
    """May collect its identity; has not yet."""
    REJECTED = "rejected"
    ENROLLED = "enrolled"
    """Collected its broker identity (it may collect it again, with its device key)."""


class Refusal(StrEnum):
    """Why a device's enrolment request is refused: the ``reason`` of a 401/403/409."""

    UNKNOWN_CLAIM = "unknown_claim"
    CLAIM_EXPIRED = "claim_expired"
    CLAIM_REVOKED = "claim_revoked"
    CLAIM_USED_UP = "claim_used_up"
    OUT_OF_SCOPE = "out_of_scope"
    REJECTED = "rejected"
    DEVICE_KEY_MISMATCH = "device_key_mismatch"
    DEVICE_EXISTS = "device_exists"
