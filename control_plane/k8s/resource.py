"""ModelRollout objects <-> the rollout engine: the spec as a RolloutSpec, a Rollout row as
``.status`` (phase, waves, counts, gate report, rollback, conditions)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from control_plane.db.models import Rollout
from control_plane.errors import Invalid
from control_plane.k8s.api import Obj
from control_plane.rollouts import RolloutSpec

PHASES = {
    "pending": "Pending",
    "running": "Running",
    "paused": "Paused",
    "rolling_back": "RollingBack",
    "succeeded": "Succeeded",
    "rolled_back": "RolledBack",
    "cancelled": "Cancelled",
}
FINAL = ("Succeeded", "RolledBack", "Cancelled", "Failed")

# engine device state -> .status.counts key
OUTCOME = {
    "pending": "pending",
    "sent": "updating",
    "committed": "committed",
    "rejected": "failed",
    "rolled_back": "failed",
    "timed_out": "failed",
    "revert_timed_out": "failed",
    "reverting": "reverting",
    "reverting_pending": "reverting",
    "reverted": "reverted",
    "skipped": "skipped",
}

# RolloutSpec field -> where it is in the object, for error messages that name the field
FIELDS = {
    "model": "spec.model",
    "version": "spec.version",
    "selector": "spec.selector.matchLabels",
    "profiles": "spec.selector.profiles",
    "waves": "spec.waves",
    "bake_time_s": "spec.bakeTimeSeconds",
    "device_timeout_s": "spec.deviceTimeoutSeconds",
    "gates": "spec.gates",
}
GATES = {
    "maxErrorRate": "max_error_rate",
    "maxP99Ratio": "max_p99_ratio",
    "minRequests": "min_requests",
    "selfTest": "self_test",
    "maxRejections": "max_rejections",
}


def rollout_spec(obj: Obj) -> RolloutSpec:
    """The engine's spec of a ModelRollout.

    Raises:
        Invalid: naming the object's field (the API server validates against the CRD's schema
            already; this catches what it cannot, such as a wave larger than 100 %).
    """
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise Invalid("spec: missing")
    selector = spec.get("selector") or {}
    fields: dict[str, Any] = {
        "model": spec.get("model"),
        "version": spec.get("version"),
        "selector": selector.get("matchLabels") or {},
        "profiles": selector.get("profiles") or [],
        "gates": {GATES.get(k, k): v for k, v in (spec.get("gates") or {}).items()},
    }
    for name, key in (
        ("waves", "waves"),
        ("bake_time_s", "bakeTimeSeconds"),
        ("device_timeout_s", "deviceTimeoutSeconds"),
    ):
        if key in spec:
            fields[name] = spec[key]
    try:
        return RolloutSpec.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first["loc"]]
        where = FIELDS.get(loc[0], f"spec.{loc[0]}") if loc else "spec"
        if loc[:1] == ["gates"] and len(loc) > 1:
            where += "." + next((k for k, v in GATES.items() if v == loc[1]), loc[1])
        elif len(loc) > 1:
            where += f"[{loc[1]}]"
        raise Invalid(f"{where}: {first['msg']}") from None


def rollout_status(rollout: Rollout, generation: int) -> Obj:
    """``.status`` without conditions for a rollout and its devices."""
    counts = {k: 0 for k in sorted(set(OUTCOME.values()))}
    for d in rollout.devices:
        counts[OUTCOME.get(d.state, "failed")] += 1
    counts["targeted"] = len(rollout.devices)
    waves = []
    for i, size in enumerate(rollout.waves):
        states = Counter(d.state for d in rollout.devices if d.wave == i)
        waves.append(
            {"wave": i, "size": str(size), "devices": sum(states.values()), "states": dict(states)}
        )
    status: Obj = {
        "observedGeneration": generation,
        "phase": PHASES.get(rollout.state, "Failed"),
        "rolloutId": rollout.id,
        "sequence": rollout.sequence,
        "message": rollout.reason,
        "currentWave": rollout.current_wave,
        "waves": waves,
        "counts": counts,
    }
    report = rollout.gate_report.get(str(rollout.current_wave))
    if report:
        status["gateReport"] = _gate_report(rollout.current_wave, report)
    if rollout.state in ("rolling_back", "rolled_back"):
        status["rollback"] = {
            "reason": rollout.reason,
            "completed": rollout.state == "rolled_back",
            "reverting": counts["reverting"],
            "reverted": counts["reverted"],
            "failed": sum(1 for d in rollout.devices if d.state == "revert_timed_out"),
        }
    return status


def _gate_report(wave: int, report: dict[str, Any]) -> Obj:
    keys = {
        "requests": "requests",
        "errors": "errors",
        "error_rate": "errorRate",
        "p99_ms": "p99Ms",
        "p99_ratio": "p99Ratio",
        "note": "note",
    }
    out: Obj = {"wave": wave}
    out.update({keys[k]: v for k, v in report.items() if k in keys and v is not None})
    return out


def rollout_conditions(status: Obj, rollout: Rollout) -> list[tuple[str, bool, str, str]]:
    """(type, status, reason, message) of an accepted rollout's conditions."""
    phase, message = status["phase"], rollout.reason
    aborted = message.startswith("aborted by")
    active = phase in ("Running", "Paused", "RollingBack")
    rolling_back = phase in ("RollingBack", "RolledBack")
    return [
        ("Accepted", True, "RolloutCreated", f"control plane rollout {rollout.id}"),
        ("Progressing", active, phase, message or f"wave {rollout.current_wave}"),
        ("Succeeded", phase == "Succeeded", phase, message),
        (
            "RolledBack",
            rolling_back,
            ("Aborted" if aborted else "GateFailed") if rolling_back else "NotRolledBack",
            message if rolling_back else "",
        ),
    ]


def conditions(
    previous: list[Obj], wanted: list[tuple[str, bool, str, str]], generation: int, now: datetime
) -> list[Obj]:
    """metav1.Condition entries; lastTransitionTime only moves when the status flips."""
    before = {c.get("type"): c for c in previous}
    out = []
    for kind, ok, reason, message in wanted:
        value = "True" if ok else "False"
        old = before.get(kind)
        when = (
            old["lastTransitionTime"]
            if old and old.get("status") == value and old.get("lastTransitionTime")
            else now.strftime("%Y-%m-%dT%H:%M:%SZ")
        )
        out.append(
            {
                "type": kind,
                "status": value,
                "reason": reason,
                "message": message,
                "lastTransitionTime": when,
                "observedGeneration": generation,
            }
        )
    return out
