"""OpenTelemetry spans of a rollout, for an operator following it in Jaeger or Tempo (the
``tracing`` extra). With tracing off the engine holds a :class:`RolloutSpans`, which does
nothing and imports nothing; :class:`TracedRollouts` exports::

    POST /api/v1/rollouts                  the operator's call (control_plane.api.tracing)
      rollout mlp v2                       created .. succeeded | rolled_back | cancelled
        wave 0                             the wave's first step .. passed or left
          shadow wave 0                    the shadow phase began .. passed | failed
          gates wave 0                     the bake began .. passed | failed | paused
        pause | resume | abort | cancel    an operator's action, linked to its API call
        rollback                           the first rollback step .. every device back

A rollout's steps run over many ticks, on whichever replica leads, across restarts. So a
span that stays open over steps (the rollout's, a wave's, the rollback's) is opened by
storing its ids and start time on the rollout's row (``Rollout.trace``, committed with the
step), and exported once, when it ends, by the process that ends it, under the stored ids
(:mod:`.span_ids`): a control plane restarted mid-rollout continues the same trace, and no
span is exported twice. What a span exports is handed to the caller's ``hold`` and sent only
once the step's transaction committed, as the engine's publications are.

Waves are numbered as the CLI and the API show them, from 0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

from common.tracing import TracingSettings, tracer_provider
from control_plane.db.models import Rollout, RolloutDevice
from control_plane.db.session import required_utc
from control_plane.db.states import DeviceRolloutState, RolloutState

Hold = Callable[[Callable[[], None]], None]
"""Keeps an export until the transaction that decided it committed."""

ACTIONS = {
    RolloutState.PAUSED: "pause",
    RolloutState.RUNNING: "resume",
    RolloutState.ROLLING_BACK: "abort",
    RolloutState.CANCELLED: "cancel",
}
UNSENT = (DeviceRolloutState.PENDING, DeviceRolloutState.SKIPPED)


class RolloutSpans:
    """The engine's spans with tracing off: every method does nothing (the interface)."""

    def begin(self, rollout: Rollout) -> None:
        """``rollout`` was just planned: its span opens in the current trace (the API call's)."""

    def wave(self, rollout: Rollout, wave_devices: list[RolloutDevice], now: datetime) -> None:
        """A step (at ``now``) of the current wave: its span opens at the wave's first."""

    def shadow(self, rollout: Rollout, now: datetime, hold: Hold) -> None:
        """The current wave's shadow phase was stepped: its span, once it passed or failed."""

    def judged(
        self, rollout: Rollout, wave: int, baked_from: datetime | None, now: datetime, hold: Hold
    ) -> None:
        """Wave ``wave`` was judged: a gates span for a verdict (passed, failed, paused),
        from its bake's start (``baked_from``: as it was before the judgement, which clears
        it for the next wave)."""

    def rollback(self, rollout: Rollout, now: datetime, hold: Hold) -> None:
        """A rollback step (at ``now``): its span opens at the first (the wave's ends there)."""

    def action(self, rollout: Rollout, user: str | None, now: datetime, hold: Hold) -> None:
        """An operator moved ``rollout`` to its state (pause, resume, abort, cancel)."""

    def ended(self, rollout: Rollout, now: datetime, hold: Hold) -> None:
        """``rollout`` reached a final state: its open spans end, its own last."""


class TracedRollouts(RolloutSpans):
    """The spans exported (see the module's docstring). ``provider``: the control plane's
    tracer provider, built here with its ``StoredIds``; its API spans share it."""

    def __init__(self, settings: TracingSettings) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace import (
            Link,
            NonRecordingSpan,
            SpanContext,
            Status,
            StatusCode,
            TraceFlags,
        )

        from control_plane.rollouts.span_ids import StoredIds

        self.ids = StoredIds()
        self.provider = tracer_provider(settings, "edgefleet-control-plane", id_generator=self.ids)
        self._tracer = self.provider.get_tracer("edgefleet.control_plane.rollouts")
        self._trace, self._link = trace, Link
        self._span_context, self._non_recording = SpanContext, NonRecordingSpan
        self._sampled = TraceFlags(TraceFlags.SAMPLED)  # only sampled rollouts keep a trace
        self._status = functools.partial(Status, StatusCode.ERROR)
        self._no_parent: Any = Context()
        """A rollout created outside any trace (a deployment's loop): its span is a root, in
        whatever process ends it (never a child of the call that happens to end it)."""

    def _parent(self, ids: tuple[int, int]) -> Any:
        """The context of a span by its ids (stored: maybe another process's), as a parent."""
        span = self._span_context(*ids, is_remote=True, trace_flags=self._sampled)
        return self._trace.set_span_in_context(self._non_recording(span), self._no_parent)

    # -- opening and ending spans kept on the row ---------------------------------------------

    def begin(self, rollout: Rollout) -> None:
        span = self._tracer.start_span(_root_name(rollout))  # in the current (API call's) trace
        if not span.is_recording():
            return  # not sampled: nothing of this rollout is
        # NOTE: never ended: only its ids and start are kept; it is exported when it ends
        ctx, parent = span.get_span_context(), span.parent
        rollout.trace = {
            "traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01",
            "parent_span_id": f"{parent.span_id:016x}" if parent else None,
            "open": {"rollout": {"span_id": f"{ctx.span_id:016x}", "start_ns": span.start_time}},
        }

    def _open(self, rollout: Rollout, key: str, now: datetime, **extra: Any) -> None:
        """Open span ``key``, from the step's ``now`` (what it records dates from then)."""
        assert rollout.trace is not None
        opened = {"span_id": f"{self.ids.generate_span_id():016x}", "start_ns": _ns(now)}
        # a new object: the JSON column sees assignments, not changes inside it
        open_ = {**rollout.trace["open"], key: opened | extra}
        rollout.trace = {**rollout.trace, "open": open_}

    def _end(
        self,
        rollout: Rollout,
        key: str,
        name: str,
        attributes: dict[str, Any],
        now: datetime,
        hold: Hold,
        error: str | None = None,
    ) -> None:
        """End the open span ``key`` at ``now``; exported under its stored ids once committed."""
        assert rollout.trace is not None
        open_ = dict(rollout.trace["open"])
        span = open_.pop(key, None)
        if span is None:
            return
        rollout.trace = {**rollout.trace, "open": open_}
        trace_id, root_id = _ids(rollout.trace)
        if key == "rollout":
            parent = rollout.trace["parent_span_id"]
            context = self._parent((trace_id, int(parent, 16))) if parent else self._no_parent
        else:
            context = self._parent((trace_id, root_id))
        export = functools.partial(
            self._export,
            (trace_id, int(span["span_id"], 16)),
            name,
            context,
            (span["start_ns"], _ns(now)),
            _base(rollout) | attributes,
            error,
        )
        hold(export)

    def _export(
        self,
        ids: tuple[int, int],
        name: str,
        context: Any,
        times_ns: tuple[int, int],
        attributes: dict[str, Any],
        error: str | None,
    ) -> None:
        with self.ids.fixed(*ids):
            span = self._tracer.start_span(
                name, context=context, start_time=times_ns[0], attributes=attributes
            )
        if error:
            span.set_status(self._status(error))
        span.end(end_time=times_ns[1])

    def _child(
        self,
        rollout: Rollout,
        parent_key: str,
        name: str,
        attributes: dict[str, Any],
        now: datetime,
        hold: Hold,
        *,
        start_ns: int | None = None,
        error: str | None = None,
        link: Any = None,
    ) -> None:
        """A span that ends at the step's ``now``: a child of the open span ``parent_key``
        (the rollout's, if that one is not open)."""
        assert rollout.trace is not None
        trace_id, root_id = _ids(rollout.trace)
        parent = rollout.trace["open"].get(parent_key)
        parent_id = int(parent["span_id"], 16) if parent else root_id
        context = self._parent((trace_id, parent_id))
        attributes = _base(rollout) | attributes
        links = [self._link(link)] if link is not None else []
        ended = _ns(now)  # when it was decided, not when the transaction committed

        def export() -> None:
            span = self._tracer.start_span(
                name,
                context=context,
                start_time=ended if start_ns is None else start_ns,
                attributes=attributes,
                links=links,
            )
            if error:
                span.set_status(self._status(error))
            span.end(end_time=ended)

        hold(export)

    # -- what the engine tells --------------------------------------------------------------

    def wave(self, rollout: Rollout, wave_devices: list[RolloutDevice], now: datetime) -> None:
        if rollout.trace is None:
            return
        opened = rollout.trace["open"].get("wave")
        if opened is None or opened["wave"] != rollout.current_wave:
            self._open(rollout, "wave", now, wave=rollout.current_wave, devices=len(wave_devices))

    def _end_wave(
        self, rollout: Rollout, outcome: str, now: datetime, hold: Hold, error: str | None
    ) -> None:
        assert rollout.trace is not None
        opened = rollout.trace["open"].get("wave")
        if opened is None:
            return
        devices = [d for d in rollout.devices if d.wave == opened["wave"]]
        attributes = {
            "edgefleet.rollout.wave": opened["wave"],
            "edgefleet.rollout.wave.size": str(rollout.waves[opened["wave"]]),
            "edgefleet.rollout.wave.devices": len(devices),
            "edgefleet.rollout.wave.devices_sent": sum(d.state not in UNSENT for d in devices),
            "edgefleet.rollout.wave.devices_committed": sum(
                d.state is DeviceRolloutState.COMMITTED for d in devices
            ),
            "edgefleet.rollout.wave.outcome": outcome,
        }
        self._end(rollout, "wave", f"wave {opened['wave']}", attributes, now, hold, error)

    def shadow(self, rollout: Rollout, now: datetime, hold: Hold) -> None:
        if rollout.trace is None or rollout.shadow is None:
            return
        wave = rollout.current_wave
        state = rollout.shadow["waves"].get(str(wave))
        opened = rollout.trace["open"].get("wave")
        if state is None or state["state"] not in ("passed", "failed") or opened is None:
            return
        if opened.get("shadow_done"):
            return  # exported at an earlier step
        open_ = {**rollout.trace["open"], "wave": opened | {"shadow_done": True}}
        rollout.trace = {**rollout.trace, "open": open_}
        attributes = {"edgefleet.rollout.wave": wave, "edgefleet.shadow.verdict": state["state"]}
        attributes |= _figures("edgefleet.shadow", state, skip={"state", "started_at"})
        started = _ns(datetime.fromisoformat(state["started_at"]))
        error = state.get("reason") if state["state"] == "failed" else None
        self._child(
            rollout,
            "wave",
            f"shadow wave {wave}",
            attributes,
            now,
            hold,
            start_ns=started,
            error=error,
        )

    def judged(
        self, rollout: Rollout, wave: int, baked_from: datetime | None, now: datetime, hold: Hold
    ) -> None:
        if rollout.trace is None:
            return
        if rollout.current_wave != wave or rollout.state is RolloutState.SUCCEEDED:
            verdict = "passed"
        elif rollout.state is RolloutState.ROLLING_BACK:
            verdict = "failed"
        elif rollout.state is RolloutState.PAUSED:
            verdict = "paused"
        else:
            return  # still baking, or waiting for devices or traffic: no verdict yet
        report = rollout.gate_report.get(str(wave), {})
        attributes = {"edgefleet.rollout.wave": wave, "edgefleet.gate.verdict": verdict}
        attributes |= _figures("edgefleet.gate", report)
        if verdict != "passed":
            attributes["edgefleet.gate.reason"] = rollout.reason
        baked = rollout.bake_started_at or baked_from
        started = _ns(required_utc(baked)) if baked else None
        error = rollout.reason if verdict == "failed" else None
        self._child(
            rollout,
            "wave",
            f"gates wave {wave}",
            attributes,
            now,
            hold,
            start_ns=started,
            error=error,
        )
        if verdict == "passed":
            self._end_wave(rollout, verdict, now, hold, None)
        if rollout.state is RolloutState.SUCCEEDED:
            self.ended(rollout, now, hold)

    def rollback(self, rollout: Rollout, now: datetime, hold: Hold) -> None:
        if rollout.trace is None or "rollback" in rollout.trace["open"]:
            return
        # the wave ends where its rollback begins: a gate or its shadow phase failed it, or
        # an operator aborted the rollout
        self._end_wave(rollout, "rolled_back", now, hold, rollout.reason)
        self._open(rollout, "rollback", now, reason=rollout.reason)

    def action(self, rollout: Rollout, user: str | None, now: datetime, hold: Hold) -> None:
        if rollout.trace is None:
            return
        attributes: dict[str, Any] = {"edgefleet.rollout.state": str(rollout.state)}
        if user:
            attributes["edgefleet.rollout.actor"] = user
        api_call = self._trace.get_current_span().get_span_context()
        name = ACTIONS.get(rollout.state, str(rollout.state))
        self._child(
            rollout,
            "rollout",
            name,
            attributes,
            now,
            hold,
            link=api_call if api_call.is_valid else None,
        )

    def ended(self, rollout: Rollout, now: datetime, hold: Hold) -> None:
        if rollout.trace is None:
            return
        outcome = str(rollout.state)
        failed = rollout.reason if rollout.state is RolloutState.ROLLED_BACK else None
        self._end_wave(rollout, outcome, now, hold, None)
        touched = [d for d in rollout.devices if d.state not in UNSENT]
        states: dict[str, int] = {}
        for d in touched:
            states[str(d.state)] = states.get(str(d.state), 0) + 1
        back = {f"edgefleet.rollout.devices.{s}": n for s, n in states.items()}
        self._end(rollout, "rollback", "rollback", back, now, hold, failed)
        attributes = {
            "edgefleet.rollout.state": outcome,
            "edgefleet.rollout.reason": rollout.reason,
            "edgefleet.rollout.waves": len(rollout.waves),
            "edgefleet.rollout.devices": len(rollout.devices),
            "edgefleet.rollout.created_by": rollout.created_by,
        }
        if rollout.deployment_id is not None:
            attributes["edgefleet.deployment.id"] = rollout.deployment_id
        self._end(rollout, "rollout", _root_name(rollout), attributes, now, hold, failed)


def _root_name(rollout: Rollout) -> str:
    return f"rollout {rollout.model} v{rollout.version}"


def _base(rollout: Rollout) -> dict[str, Any]:
    return {
        "edgefleet.rollout.id": rollout.id,
        "edgefleet.model": rollout.model,
        "edgefleet.model.version": rollout.version,
    }


def _ids(trace: Mapping[str, Any]) -> tuple[int, int]:
    """The trace id and the rollout's span id, from its stored ``traceparent``."""
    _, trace_id, span_id, _ = trace["traceparent"].split("-")
    return int(trace_id, 16), int(span_id, 16)


def _figures(prefix: str, report: Mapping[str, Any], skip: Collection[str] = ()) -> dict[str, Any]:
    """A gate's report as attributes: its numbers, flags and words, nested ones dotted (the
    drift gate's); None (a figure not measured yet) left out."""
    out: dict[str, Any] = {}
    for key, value in report.items():
        if key in skip or value is None:
            continue
        if isinstance(value, Mapping):
            out |= _figures(f"{prefix}.{key}", value)
        elif isinstance(value, bool | int | float | str):
            out[f"{prefix}.{key}"] = value
    return out


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1e9)
