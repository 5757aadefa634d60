"""The states of a rollout and of each device in it: one definition for the engine, the API,
the CLI and the ``ModelRollout`` CRD's status.

A rollout::

    running --pause--> paused --resume--> running
    running | paused --cancel--> cancelled                  (devices keep what they have)
    running | paused --abort, a failed gate--> rolling_back --every device back--> rolled_back
    running --the last wave passed--> succeeded

A device in a rollout::

    pending --its wave starts--> sent --> committed | rejected | rolled_back | timed_out
    pending --the rollout rolls back first--> skipped
    sent | committed | timed_out --rollback--> reverting --> reverted | revert_timed_out
                                           or reverting_pending (its desired state restored,
                                           nothing to send) --> reverted
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
    """Not reached before the rollout rolled back."""
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
