"""The ``max_accuracy_drop`` gate of a rollout's wave: the new version's live accuracy (from
the outcomes apps post for its predictions) against the live accuracy of the version it
replaces, the live baseline.

The new version's outcomes are those received since the rollout began from the committed
devices of the waves so far; the baseline's, those received from ``BASELINE`` before the
rollout began until now, from any device (the devices not switched yet go on feeding it).
Each side needs ``gates.min_outcomes`` before the gate judges: until then the wave waits past
its bake, as the other gates do without traffic. Over the limit the rollout is paused, not
rolled back (as ``max_drift``): outcomes that moved for both versions at once (concept drift)
would otherwise roll back a good version; an operator decides.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import Rollout, RolloutDevice
from control_plane.db.session import required_utc
from control_plane.db.states import DeviceRolloutState
from control_plane.quality.accuracy import Live, live_sums
from control_plane.rollouts.spec import Gates

BASELINE = timedelta(hours=1)
"""How far before a rollout the baseline's outcomes count."""


async def accuracy_gate(
    session: AsyncSession,
    rollout: Rollout,
    gates: Gates,
    touched: list[RolloutDevice],
    now: datetime,
    previous: dict[str, Any] | None,
) -> tuple[str | None, dict[str, Any] | None]:
    """Judge ``gates.max_accuracy_drop``: why the rollout pauses, or None, and the report (None
    when the gate is off; ``judged`` false while either side has too few outcomes).
    ``previous``: this wave's accuracy report at the last step: a wave the operator resumed
    after an accuracy pause is not paused again."""
    limit = gates.max_accuracy_drop
    if limit is None:
        return None, None
    report: dict[str, Any] = {
        "max_accuracy_drop": limit,
        "min_outcomes": gates.min_outcomes,
        "judged": False,
    }
    baseline = {d.previous_version for d in touched if d.previous_version is not None}
    baseline.discard(rollout.version)
    if not baseline:
        report["note"] = "no device of the waves served an earlier version: no baseline"
        return None, report
    base_version = max(baseline)
    ids = [d.device_id for d in touched if d.state is DeviceRolloutState.COMMITTED]
    created = required_utc(rollout.created_at)
    new = await live_sums(session, rollout.model, rollout.version, created, now, ids)
    base = await live_sums(session, rollout.model, base_version, created - BASELINE, now)
    report |= {"baseline_version": base_version, "new": new.doc(), "baseline": base.doc()}
    if min(new.outcomes, base.outcomes) < gates.min_outcomes:
        report["note"] = (
            f"fewer than {gates.min_outcomes} outcomes for v{rollout.version} or "
            f"v{base_version}: accuracy not judged yet"
        )
        return None, report
    report["judged"] = True
    verdict = accuracy_verdict(new, base, limit, rollout.version, base_version)
    if verdict is None:
        return None, report
    report["paused"] = True
    if previous is not None and previous.get("paused"):
        report["note"] = "over max_accuracy_drop; resumed by an operator: not paused again"
        return None, report
    return verdict, report


def accuracy_verdict(
    new: Live, base: Live, limit: float, version: int, base_version: int
) -> str | None:
    """Why ``new`` fails against ``base``: accuracy more than ``limit`` below, or (a
    regression) mean absolute error more than ``limit`` above, relative; else None."""
    if new.accuracy is not None and base.accuracy is not None:
        drop = base.accuracy - new.accuracy
        if drop <= limit:
            return None
        return (
            f"live accuracy: v{version} {new.accuracy:.3f} over {new.outcomes} outcomes is "
            f"{drop:.3f} below v{base_version}'s {base.accuracy:.3f} "
            f"(max_accuracy_drop {limit:g})"
        )
    new_error, base_error = new.mean_abs_error, base.mean_abs_error
    if new_error is None or base_error is None:
        return None  # one regression, one classification: nothing comparable
    rise = (new_error - base_error) / base_error if base_error else float(new_error > 0)
    if rise <= limit:
        return None
    return (
        f"live error: v{version} mean absolute error {new_error:.4g} over {new.outcomes} "
        f"outcomes is {rise:.1%} above v{base_version}'s {base_error:.4g} "
        f"(max_accuracy_drop {limit:g})"
    )
