"""Fleet routes: devices, rollouts, telemetry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel
from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload
from starlette.responses import Response

from control_plane.api import audit
from control_plane.api.body import json_body, json_request
from control_plane.api.deps import (
    INT32_MAX,
    OPERATOR,
    ROW_ID,
    SESSION,
    VIEWER,
    json_response,
    services,
)
from control_plane.api.device_sql import AgentState, DeviceFilter, presence_sql
from control_plane.api.device_sql import summary as fleet_summary
from control_plane.db.models import (
    Device,
    DeviceSample,
    Rollout,
    RolloutDevice,
    TelemetrySample,
    UpdateEventRecord,
)
from control_plane.db.session import stored_utc
from control_plane.db.states import RolloutState
from control_plane.errors import Invalid, NotFound
from control_plane.ingest.presence import Presence
from control_plane.quality.cost import rollout_cost
from control_plane.rollouts.cancel import CancelOutcome, device_switches
from control_plane.rollouts.noise import p99_noise, selected_devices
from control_plane.rollouts.phases import device_phases, phase_doc
from control_plane.rollouts.spec import RolloutSpec
from control_plane.tokens import Principal
from control_plane.twins import documents as twin_documents

router = APIRouter(prefix="/api/v1", tags=["Fleet"])
LABELS = Query(default=[], description="key=value; repeat for several")
AGENT = Query(
    default=None,
    description="only devices whose agent is degraded (crash-looping) or went back from a "
    "release (rolled_back)",
)


def presence_of(request: Request, d: Device, now: datetime | None = None) -> Presence:
    """``d``'s presence: its last status, checked against how long it has been silent."""
    svc = services(request)
    return svc.silence.presence(
        d.online,
        d.last_seen,
        d.telemetry_interval_s,
        now=now or datetime.now(UTC),
        hearing_since=svc.metrics.hearing_since,
    )


def device_doc(d: Device, presence: Presence) -> dict[str, Any]:
    return {
        "id": d.id,
        "hardware_profile": d.hardware_profile,
        "agent_version": d.agent_version,
        "labels": d.labels,
        "reported_labels": d.reported_labels,
        "operator_labels": d.operator_labels,
        "models": d.models,
        "online": presence is Presence.ONLINE,
        "presence": presence.value,
        "last_seen": stored_utc(d.last_seen).isoformat() if d.last_seen else None,
        "telemetry_interval_s": d.telemetry_interval_s,
        "trust_root_version": d.trust_root_version,
        "launcher": d.launcher,
    }


async def last_telemetry(s: AsyncSession, device_id: str) -> dict[str, Any] | None:
    """The device part of ``device_id``'s newest telemetry message (by its own clock), or None.

    The table has no index by device (see ``TelemetrySample``): this walks the (time, device_id,
    seq) key from its newest end and stops at the device's first entry, a few of the fleet's
    latest messages away for a device that reports; one with none walks the whole key (what raw
    retention keeps; measured: about 50 ms per million rows on SQLite, 20 on PostgreSQL)."""
    t = DeviceSample
    row = (
        await s.execute(select(t).where(t.device_id == device_id).order_by(t.time.desc()).limit(1))
    ).scalar_one_or_none()
    if row is None:
        return None
    return {
        "seq": row.seq,
        "time": stored_utc(row.time).isoformat(),
        "cpu_percent": row.cpu_percent,
        "memory_used_bytes": row.memory_used_bytes,
        "temperature_c": row.temperature_c,
        "dropped": row.dropped,
    }


def _selector(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise Invalid(f"label: expected key=value, got {pair!r}")
        out[key] = value
    return out


CURSOR = Query(
    default=None,
    pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
    description="only devices after this id (the last id of the previous page)",
)


def _filter(
    label: list[str],
    profile: str | None,
    trust_root_version: int | None,
    online: bool | None,
    presence: Presence | None,
    model: str | None,
    model_version: int | None,
    agent: AgentState | None = None,
) -> DeviceFilter:
    if model_version is not None and not model:
        raise Invalid("model_version: give the model too")
    return DeviceFilter(
        _selector(label),
        profile,
        trust_root_version,
        online,
        presence,
        model,
        model_version,
        agent,
    )


def _presence_sql(request: Request, now: datetime) -> Any:
    svc = services(request)
    return presence_sql(svc.silence, now, svc.metrics.hearing_since)


@router.get(
    "/devices",
    summary="Devices, filtered by labels (label=key=value), profile, presence, trust root and "
    "served model (version); paged with limit and after",
)
async def list_devices(
    request: Request,
    label: list[str] = LABELS,
    profile: str | None = None,
    trust_root_version: int | None = Query(
        default=None, ge=1, le=INT32_MAX, description="only devices that hold this trust root"
    ),
    online: bool | None = Query(
        default=None, description="online: its last status says so and it was heard lately"
    ),
    presence: Presence | None = None,
    model: str | None = Query(default=None, description="only devices serving this model"),
    model_version: int | None = Query(
        default=None, ge=0, le=INT32_MAX, description="and that version of it"
    ),
    limit: int | None = Query(
        default=None, ge=1, le=1000, description="devices per page (none: every match)"
    ),
    after: str | None = CURSOR,
    agent: AgentState | None = AGENT,
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    wanted = _filter(
        label, profile, trust_root_version, online, presence, model, model_version, agent
    )
    now = datetime.now(UTC)
    state = _presence_sql(request, now)
    # the filters, presence included, are the database's: a page reads its own rows only
    query = select(Device, state).where(*wanted.where(s.get_bind().dialect.name, state))
    if after is not None:
        query = query.where(Device.id > after)
    query = query.order_by(Device.id)
    if limit is not None:
        query = query.limit(limit + 1)  # one more: is there a next page?
    rows = (await s.execute(query)).all()
    docs = [device_doc(d, Presence(p)) for d, p in rows[:limit]]
    if limit is None or len(rows) <= limit:
        return json_response(docs)
    # NOTE: the next page's address in a Link header (RFC 8288), as GitHub's API gives it;
    # the body stays a list, as without limit
    following = request.url.include_query_params(after=docs[-1]["id"])
    response = json_response(docs)
    response.headers["Link"] = f'<{following}>; rel="next"'
    return response


@router.get(
    "/devices/summary",
    summary="Counts of the devices (filtered as the list is): by profile and presence, by "
    "label and presence, by served model version",
)
async def device_summary(
    request: Request,
    label: list[str] = LABELS,
    profile: str | None = None,
    presence: Presence | None = None,
    model: str | None = None,
    model_version: int | None = Query(default=None, ge=0, le=INT32_MAX),
    agent: AgentState | None = AGENT,
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    wanted = _filter(label, profile, None, None, presence, model, model_version, agent)
    state = _presence_sql(request, datetime.now(UTC))
    doc = await fleet_summary(s, wanted.where(s.get_bind().dialect.name, state), state)
    return json_response(doc)


@router.get("/devices/{device_id}", summary="One device, with its last telemetry")
async def show_device(
    request: Request, device_id: str, s: AsyncSession = SESSION, _: Principal = VIEWER
) -> Response:
    device = await s.get(Device, device_id)
    if device is None:
        raise NotFound(f"no device {device_id!r}")
    doc = device_doc(device, presence_of(request, device))
    # what the device itself last said, model or not: its load and what it could not send
    doc["last_telemetry"] = await last_telemetry(s, device_id)
    # a switch a rollout scheduled for a maintenance window, or a cancel withdrew
    doc["switches"] = await device_switches(s, device_id, datetime.now(UTC))
    return json_response(doc)


@router.get(
    "/devices/{device_id}/events", summary="A device's update history: its events, oldest first"
)
async def device_events(
    device_id: str,
    limit: int = Query(default=100, ge=1, le=1000, description="the most recent events"),
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    if await s.get(Device, device_id) is None:
        raise NotFound(f"no device {device_id!r}")
    newest = (
        await s.execute(
            select(UpdateEventRecord)
            .where(UpdateEventRecord.device_id == device_id)
            .order_by(UpdateEventRecord.id.desc())
            .limit(limit)
        )
    ).scalars()
    now = datetime.now(UTC)
    return json_response(
        [
            {"model": e.model, "version": e.version, "rollout_id": e.rollout_id} | phase_doc(e, now)
            for e in reversed(list(newest))
        ]
    )


class LabelChange(BaseModel):
    labels: dict[str, str | None]
    """Set a label, or remove it with null."""


NEW_LABELS = json_body(LabelChange, OPERATOR)
NEW_ROLLOUT = json_body(RolloutSpec, OPERATOR)


@router.patch(
    "/devices/{device_id}/labels",
    summary="Add, change or remove operator labels",
    openapi_extra=json_request(LabelChange),
)
async def set_labels(
    request: Request,
    device_id: str,
    body: LabelChange = NEW_LABELS,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    device = await s.get(Device, device_id)
    if device is None:
        raise NotFound(f"no device {device_id!r}")
    labels = dict(device.operator_labels)
    for key, value in body.labels.items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    device.operator_labels = labels
    audit.record(s, who.name, "device.labels", device_id, labels=body.labels)
    await s.flush()
    svc = services(request)
    # its label groups' config twins, resolved again (control_plane/twins)
    changed = await twin_documents.sync(s, svc.keys, only=[device_id])
    published = [(d.id, list(d.desired.values())) for d in changed]
    await s.commit()
    for changed_id, manifests in published:
        svc.bus.publish_desired(changed_id, manifests)
    return json_response(device_doc(device, presence_of(request, device)))


def rollout_doc(r: Rollout) -> dict[str, Any]:
    waves = []
    for i, size in enumerate(r.waves):
        members = [d for d in r.devices if d.wave == i]
        states: dict[str, int] = {}
        for d in members:
            states[d.state.value] = states.get(d.state.value, 0) + 1
        waves.append({"wave": i, "size": size, "devices": len(members), "states": states})
    return {
        "id": r.id,
        "model": r.model,
        "version": r.version,
        "sequence": r.sequence,
        "agent_version": r.agent_version,
        "state": r.state.value,
        "reason": r.reason,
        "current_wave": r.current_wave,
        "bake_started_at": (
            stored_utc(r.bake_started_at).isoformat() if r.bake_started_at else None
        ),
        "waves": waves,
        "selector": r.selector,
        "profiles": r.profiles,
        "bake_time_s": r.bake_time_s,
        "device_timeout_s": r.device_timeout_s,
        "gates": r.gates,
        "gate_report": r.gate_report,
        "shadow": r.shadow,
        "created_by": r.created_by,
        "deployment_id": r.deployment_id,
        "created_at": stored_utc(r.created_at).isoformat(),
        "updated_at": stored_utc(r.updated_at).isoformat(),
        # what a cancel left on the devices (control_plane.rollouts.cancel)
        "cancelled": (
            CancelOutcome.of(r).doc(r.version) if r.state is RolloutState.CANCELLED else None
        ),
        "devices": [
            {
                "device_id": d.device_id,
                "wave": d.wave,
                "state": d.state.value,
                "reason": d.reason,
                "previous_version": d.previous_version,
            }
            for d in r.devices
        ],
    }


async def _rollout(s: AsyncSession, rollout_id: int) -> Rollout:
    r = (
        await s.execute(
            select(Rollout).where(Rollout.id == rollout_id).options(selectinload(Rollout.devices))
        )
    ).scalar_one_or_none()
    if r is None:
        raise NotFound(f"no rollout {rollout_id}")
    return r


@router.post(
    "/rollouts",
    status_code=201,
    summary="Start a staged rollout of a validated version",
    openapi_extra=json_request(RolloutSpec),
)
async def create_rollout(
    request: Request,
    spec: RolloutSpec = NEW_ROLLOUT,
    who: Principal = OPERATOR,
) -> Response:
    svc = services(request)
    rollout_id = await svc.engine.create(spec, who.name)
    async with svc.sessions.begin() as s:
        audit.record(s, who.name, "rollout.create", f"rollout:{rollout_id}", **spec.model_dump())
    async with svc.sessions() as s:
        return json_response(rollout_doc(await _rollout(s, rollout_id)), 201)


@router.get("/rollouts", summary="Rollouts, newest first (a page of them)")
async def list_rollouts(
    limit: int = Query(default=50, ge=1, le=500, description="rollouts per page"),
    before: int | None = Query(
        default=None,
        ge=1,
        le=INT32_MAX,
        description="only rollouts older than this id (the last id of the previous page)",
    ),
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    # a page, not every rollout ever: each carries its device rows, thousands per rollout
    query = select(Rollout).options(selectinload(Rollout.devices)).order_by(Rollout.id.desc())
    if before is not None:
        query = query.where(Rollout.id < before)
    rows = (await s.execute(query.limit(limit))).scalars()
    return json_response([rollout_doc(r) for r in rows])


@router.get(
    "/models/{name}/p99-noise",
    summary="How much the model's own p99 moves between bake-long slices on some devices",
)
async def p99_noise_of(
    name: str,
    label: list[str] = LABELS,
    bake_time_s: float = Query(default=300.0, gt=0, le=86400),
    window_s: float = Query(default=3600.0, gt=0, le=7 * 86400),
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    selector = _selector(label)
    devices = await selected_devices(s, selector)
    now = datetime.now(UTC)
    doc = await p99_noise(s, name, devices, slice_s=bake_time_s, window_s=window_s, now=now)
    return json_response(doc | {"selector": selector, "window_s": window_s})


@router.get("/rollouts/{rollout_id}", summary="One rollout with per-wave and per-device progress")
async def show_rollout(
    rollout_id: int = ROW_ID, s: AsyncSession = SESSION, _: Principal = VIEWER
) -> Response:
    rollout = await _rollout(s, rollout_id)
    doc = rollout_doc(rollout)
    phases = await device_phases(s, rollout_id)
    for device in doc["devices"]:
        device["phase"] = phases.get(device["device_id"])
    doc["cost"] = await rollout_cost(s, rollout)
    return json_response(doc)


@router.post(
    "/rollouts/{rollout_id}/{action}",
    summary="pause, resume, abort (rolls back) or cancel (does not; withdraws scheduled "
    "switches: the answer's ``cancelled`` says what each device keeps)",
)
async def act_on_rollout(
    action: str, request: Request, rollout_id: int = ROW_ID, who: Principal = OPERATOR
) -> Response:
    engine = services(request).engine
    actions = {
        "pause": lambda: engine.pause(rollout_id, who.name),
        "resume": lambda: engine.resume(rollout_id, who.name),
        "abort": lambda: engine.abort(rollout_id, who.name),
        "cancel": lambda: engine.cancel(rollout_id, who.name),
    }
    if action not in actions:
        raise NotFound(f"no action {action!r}: pause, resume, abort or cancel")
    await actions[action]()
    async with services(request).sessions.begin() as s:
        audit.record(s, who.name, f"rollout.{action}", f"rollout:{rollout_id}")
    async with services(request).sessions() as s:
        return json_response(rollout_doc(await _rollout(s, rollout_id)))


def windows(
    since: datetime,
    *,
    device_id: str | None = None,
    model: str | None = None,
    version: int | None = None,
    rollout: Rollout | None = None,
) -> Select[TelemetrySample]:
    """Telemetry windows since ``since``, newest first, of one device, model (version) or
    rollout's model version on its devices. Those of a model version (or rollout) are the ones
    the control plane received since then, newest received first, as the health gates count
    them; the others, those whose own time (the device's clock) is since then."""
    t = TelemetrySample
    # a model version's windows come from its range of the (model, version, received_at) index,
    # which gives the order too; there is no index by received time alone
    by_version = rollout is not None or (bool(model) and version is not None)
    when = t.received_at if by_version else t.time
    query = select(t).where(when >= since)
    if device_id:
        # a range of an index by time, the device read from its entries (there is no index by
        # device: see TelemetrySample)
        query = query.where(t.device_id == device_id)
    if model:
        # without its version, the (model, version, received_at) index would give the model's
        # windows of all time, so the model is compared as an expression SQLite does not look
        # up in an index, and the time index is used
        by_model: Any = t.model if version is not None else t.model.concat("")
        query = query.where(by_model == model)
    if version is not None:
        query = query.where(t.version == version)
    if rollout is not None:
        query = query.where(
            t.model == rollout.model,
            t.version == rollout.version,
            t.device_id.in_(
                select(RolloutDevice.device_id).where(RolloutDevice.rollout_id == rollout.id)
            ),
        )
    return query.order_by(when.desc())


@router.get("/telemetry", summary="Telemetry windows, per device, model (version) or rollout")
async def telemetry(
    device_id: str | None = None,
    model: str | None = None,
    version: int | None = Query(default=None, ge=0, le=INT32_MAX),
    rollout_id: int | None = Query(default=None, ge=1, le=INT32_MAX),
    since_s: float = Query(default=3600, ge=0, le=10 * 365 * 24 * 3600),
    limit: int = Query(default=1000, ge=1, le=10000),
    s: AsyncSession = SESSION,
    _: Principal = VIEWER,
) -> Response:
    since = datetime.now(UTC) - timedelta(seconds=since_s)
    rollout = await _rollout(s, rollout_id) if rollout_id is not None else None
    query = windows(since, device_id=device_id, model=model, version=version, rollout=rollout)
    rows = (await s.execute(query.limit(limit))).scalars()
    return json_response(
        [
            {
                "device_id": r.device_id,
                "seq": r.seq,
                "time": stored_utc(r.time).isoformat(),
                "received_at": stored_utc(r.received_at).isoformat(),
                "window_s": r.window_s,
                "model": r.model,
                "version": r.version,
                "requests": r.requests,
                "errors": r.errors,
                "rows": r.rows,
                "batches": r.batches,
                "p50_ms": r.p50_ms,
                "p95_ms": r.p95_ms,
                "p99_ms": r.p99_ms,
                "queue_depth": r.queue_depth,
                "prompt_tokens": r.prompt_tokens,
                "generated_tokens": r.generated_tokens,
                "tokens_per_s": r.generated_tokens / r.window_s if r.window_s > 0 else None,
                "ttft_p99_ms": r.ttft_p99_ms,
                "inter_token_p99_ms": r.inter_token_p99_ms,
                "cost_per_1k_tokens": r.cost_per_1k_tokens,
            }
            for r in rows
        ]
    )
