"""ModelRollout objects <-> the rollout engine: the spec as a RolloutSpec, a Rollout row as
``.status`` (phase, waves, counts, gate report, rollback, conditions).

``.status`` is written as a JSON merge patch (RFC 7386): a key it should no longer have is
sent as null, and free text (reasons that quote what a device reported) is clipped to
``MAX_MESSAGE_CHARS``, below what the CRD accepts.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from control_plane.db import states
from control_plane.db.models import Rollout
from control_plane.db.states import DeviceRolloutState, RolloutState
from control_plane.errors import Invalid
from control_plane.k8s.api import Obj
from control_plane.rollouts.spec import RolloutSpec

PHASES = {
    RolloutState.RUNNING: "Running",
    RolloutState.PAUSED: "Paused",
    RolloutState.ROLLING_BACK: "RollingBack",
    RolloutState.SUCCEEDED: "Succeeded",
    RolloutState.ROLLED_BACK: "RolledBack",
    RolloutState.CANCELLED: "Cancelled",
}
"""``.status.phase`` of an accepted rollout; before the engine took it, the phase is Pending."""
FINAL = ("Succeeded", "RolledBack", "Cancelled", "Failed")
ACTIVE = tuple(PHASES[s] for s in states.ACTIVE)
MAX_MESSAGE_CHARS = 1024
"""Longest free-text status field (the CRD caps condition messages at 32,768: one device's
self-test reason alone can exceed it, and the API server then refuses every status write)."""
CLIPPED = " ... [truncated]"

# engine device state -> .status.counts key
OUTCOME = {
    DeviceRolloutState.PENDING: "pending",
    DeviceRolloutState.SENT: "updating",
    DeviceRolloutState.COMMITTED: "committed",
    DeviceRolloutState.REJECTED: "failed",
    DeviceRolloutState.ROLLED_BACK: "failed",
    DeviceRolloutState.TIMED_OUT: "failed",
    DeviceRolloutState.REVERT_TIMED_OUT: "failed",
    DeviceRolloutState.REVERTING: "reverting",
    DeviceRolloutState.REVERTING_PENDING: "reverting",
    DeviceRolloutState.REVERTED: "reverted",
    DeviceRolloutState.SKIPPED: "skipped",
    DeviceRolloutState.WITHDRAWN: "skipped",  # never switched: the CRD's counts have no more
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
    "allowUnjudged": "allow_unjudged",
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


def spec_changes(obj: Obj, rollout: Rollout) -> list[str]:
    """The fields of the object's spec that differ from what its rollout runs (the spec it was
    created with: the engine cannot change a rollout's waves, selector or gates under way)."""
    try:
        wanted = rollout_spec(obj)
    except Invalid as exc:
        return [exc.message.split(":", 1)[0]]
    running = {
        "model": rollout.model,
        "version": rollout.version,
        "selector": rollout.selector,
        "profiles": rollout.profiles,
        "waves": rollout.waves,
        "bake_time_s": rollout.bake_time_s,
        "device_timeout_s": rollout.device_timeout_s,
        # as the spec model has it now: a gate added since the rollout started is a default
        "gates": {**type(wanted.gates)().model_dump(), **rollout.gates},
    }
    fields = wanted.model_dump()
    return [where for key, where in FIELDS.items() if fields[key] != running[key]]


def clip(text: str) -> str:
    """``text`` cut to ``MAX_MESSAGE_CHARS``, saying so."""
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[: MAX_MESSAGE_CHARS - len(CLIPPED)] + CLIPPED


def merged(target: Any, patch: Any) -> Any:
    """``patch`` applied to ``target`` as a JSON merge patch (RFC 7386), as the API server
    does: whether a status write would change anything."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def rollout_status(rollout: Rollout, generation: int | None) -> Obj:
    """``.status`` without conditions for a rollout and its devices; ``generation`` is the
    object's generation whose spec the rollout runs (None: none of them, or not known)."""
    counts = {k: 0 for k in sorted(set(OUTCOME.values()))}
    for d in rollout.devices:
        counts[OUTCOME.get(d.state, "failed")] += 1
    counts["targeted"] = len(rollout.devices)
    waves = []
    for i, size in enumerate(rollout.waves):
        states = Counter(d.state.value for d in rollout.devices if d.wave == i)
        waves.append(
            {"wave": i, "size": str(size), "devices": sum(states.values()), "states": dict(states)}
        )
    status: Obj = {
        "phase": PHASES.get(rollout.state, "Failed"),
        "rolloutId": rollout.id,
        "sequence": rollout.sequence,
        "message": clip(rollout.reason),
        "currentWave": rollout.current_wave,
        "waves": waves,
        "counts": counts,
    }
    if generation is not None:
        status["observedGeneration"] = generation
    report = rollout.gate_report.get(str(rollout.current_wave))
    if report:
        status["gateReport"] = _gate_report(rollout.current_wave, report)
    if rollout.state in (RolloutState.ROLLING_BACK, RolloutState.ROLLED_BACK):
        status["rollback"] = {
            "reason": clip(rollout.reason),
            "completed": rollout.state is RolloutState.ROLLED_BACK,
            "reverting": counts["reverting"],
            "reverted": counts["reverted"],
            "failed": sum(d.state is DeviceRolloutState.REVERT_TIMED_OUT for d in rollout.devices),
        }
    return status


def _gate_report(wave: int, report: dict[str, Any]) -> Obj:
    """The report with every key it lacks as null, so that the merge patch removes what an
    earlier evaluation reported (an error rate, or the note that there were too few
    requests to judge)."""
    keys = {
        "requests": "requests",
        "errors": "errors",
        "error_rate": "errorRate",
        "p99_ms": "p99Ms",
        "p99_ratio": "p99Ratio",
        "note": "note",
    }
    out: Obj = {"wave": wave}
    out.update({name: report.get(k) for k, name in keys.items()})
    if out["note"] is not None:
        out["note"] = clip(str(out["note"]))
    return out


def rollout_conditions(
    status: Obj, rollout: Rollout, changed: list[str] | None = None
) -> list[tuple[str, bool, str, str]]:
    """(type, status, reason, message) of an accepted rollout's conditions; ``changed``: the
    spec's fields that differ from what the rollout runs (:func:`spec_changes`)."""
    phase, message = status["phase"], rollout.reason
    aborted = message.startswith("aborted by")
    active = phase in ACTIVE
    rolling_back = phase in ("RollingBack", "RolledBack")
    if changed:
        applied = status.get("observedGeneration")
        spec_applied = (
            "SpecApplied",
            False,
            "ImmutableWhileRunning" if active else "RolloutFinished",
            f"{', '.join(changed)} changed after rollout {rollout.id} started: not applied; "
            + (
                f"it runs the spec of generation {applied}"
                if applied
                else "it runs the spec it was created with"
            )
            + " (a running rollout takes spec.paused and spec.abort only; "
            "create another ModelRollout for the rest)",
        )
    else:
        spec_applied = ("SpecApplied", True, "Applied", f"rollout {rollout.id} runs this spec")
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
        spec_applied,
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
                "message": clip(message),
                "lastTransitionTime": when,
                "observedGeneration": generation,
            }
        )
    return out
