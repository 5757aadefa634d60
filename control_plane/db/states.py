"""The states the database stores, one definition for the engine, the API, the CLI, the
console and the ``ModelRollout`` CRD's status: of a rollout and of each device in it, of a claim
and of an enrolment, and the reasons a device's enrolment is refused. They live here, below
every area, because the models (:mod:`.models`) store them.

A rollout::

    running --pause--> paused --resume--> running
    running | paused --cancel--> cancelled    (switched devices keep the new version; scheduled
                                               switches are withdrawn; see rollouts.cancel)
    running | paused --abort, a failed gate--> rolling_back --every device back--> rolled_back
    running --the last wave passed--> succeeded

A device in a rollout::

    pending --its wave starts--> sent --> committed | rejected | rolled_back | timed_out
    pending --the rollout rolls back or is cancelled first--> skipped
    sent, its switch scheduled for a maintenance window --cancel--> withdrawn
    sent | committed | timed_out --rollback--> reverting --> reverted | revert_timed_out
                                           or reverting_pending (its desired state restored,
                                           nothing to send) --> reverted

An enrolment::

    (claim presented) --> pending --approve--> approved --identity collected--> enrolled
                          pending --reject---> rejected
    (claim presented, no approval required) --> approved --> enrolled
"""

from __future__ import annotations

from enum import StrEnum


class RolloutState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    ROLLING_BACK = "rolling_back"
    SUCCEEDED = "succeeded"
    ROLLED_BACK = "rolled_back"
    CANCELLED = "cancelled"


ACTIVE = (RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.ROLLING_BACK)
"""The engine still moves these (at most one active rollout per model and device); a tuple,
as SQL's ``IN`` takes it."""
FINISHED = tuple(s for s in RolloutState if s not in ACTIVE)


class DeviceRolloutState(StrEnum):
    PENDING = "pending"
    """In a wave that has not started."""
    SENT = "sent"
    """The new desired state is published; the device has not reported an outcome yet."""
    COMMITTED = "committed"
    """Serving the new version after its health window."""
    REJECTED = "rejected"
    """Refused the manifest (a signature, a target, an artifact)."""
    ROLLED_BACK = "rolled_back"
    """Tried the new version and went back to the previous one on its own."""
    TIMED_OUT = "timed_out"
    """Reported nothing within the device timeout."""
    SKIPPED = "skipped"
    """Not reached before the rollout rolled back or was cancelled."""
    WITHDRAWN = "withdrawn"
    """Sent with its switch scheduled (a maintenance window, ``sent_at`` the opening), and
    the rollout cancelled before then: its desired state restored, it never switches."""
    REVERTING = "reverting"
    """Rolling back: the previous desired state is published again."""
    REVERTING_PENDING = "reverting_pending"
    """Rolling back with its desired state restored and nothing to send."""
    REVERTED = "reverted"
    REVERT_TIMED_OUT = "revert_timed_out"


WAVE_DONE = frozenset(
    {
        DeviceRolloutState.COMMITTED,
        DeviceRolloutState.REJECTED,
        DeviceRolloutState.ROLLED_BACK,
        DeviceRolloutState.TIMED_OUT,
    }
)
"""Outcomes after which a device no longer holds its wave open."""
FAILED = frozenset({DeviceRolloutState.REJECTED, DeviceRolloutState.ROLLED_BACK})
"""Outcomes the device itself reported as a failure of the new version."""
REVERTING = frozenset({DeviceRolloutState.REVERTING, DeviceRolloutState.REVERTING_PENDING})
"""Rolling back, not yet seen back on the previous version."""


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
