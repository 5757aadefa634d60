"""Deployment routes: create, list, show (with compliance), change (a new version is a
rollout), pause and resume, and delete a continuous deployment."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from control_plane.api import audit, windows
from control_plane.api.body import json_body, json_request
from control_plane.api.deps import (
    OPERATOR,
    SESSION,
    VIEWER,
    Services,
    field_error,
    json_response,
    services,
)
from control_plane.db.models import Deployment, Rollout
from control_plane.db.session import required_utc
from control_plane.db.states import RolloutState
from control_plane.deployments.reconciler import DeploymentReconciler
from control_plane.deployments.spec import DeploymentChange, DeploymentSpec, changed
from control_plane.deployments.view import FleetView, load_view
from control_plane.errors import Busy, Conflict, Invalid, NotFound
from control_plane.registry.store import get_version
from control_plane.rollouts.plan import refuse_unjudgeable
from control_plane.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["Deployments"])
NEW_DEPLOYMENT = json_body(DeploymentSpec, OPERATOR)
CHANGE = json_body(DeploymentChange, OPERATOR)


def attach(app: FastAPI, svc: Services) -> None:
    """Wire the reconciler (run by the app's lifespan) and mount the routes."""
    app.state.deployments = DeploymentReconciler(
        svc.sessions, svc.engine, tick_s=svc.settings.deployment_tick_s
    )
    app.include_router(router)
    app.include_router(windows.router)


def reconciler(request: Request) -> DeploymentReconciler:
    r: DeploymentReconciler = request.app.state.deployments
    return r


def deployment_doc(
    d: Deployment, fleet: FleetView, problem: str | None, *, devices: bool = False
) -> dict[str, Any]:
    view = fleet.deployments[d.id]
    doc: dict[str, Any] = {
        "name": d.name,
        "model": d.model,
        "version": d.version,
        "selector": d.selector,
        "profiles": d.profiles,
        "priority": d.priority,
        "waves": d.waves,
        "bake_time_s": d.bake_time_s,
        "device_timeout_s": d.device_timeout_s,
        "gates": d.gates,
        "created_by": d.created_by,
        "created_at": required_utc(d.created_at).isoformat(),
        "updated_at": required_utc(d.updated_at).isoformat(),
        "status": {**fleet.summary(d.id), "active_rollout": view.active_rollout},
        "problem": problem,
        "paused": d.paused_by is not None,
        "paused_by": d.paused_by,
        "paused_at": required_utc(d.paused_at).isoformat() if d.paused_at else None,
    }
    if devices:
        doc["devices"] = {i: s.value for i, s in sorted(fleet.states(d.id).items())}
    return doc


async def _named(s: AsyncSession, name: str) -> Deployment:
    d = (await s.execute(select(Deployment).where(Deployment.name == name))).scalar_one_or_none()
    if d is None:
        raise NotFound(f"no deployment {name!r}")
    return d


async def _check_version(s: AsyncSession, spec: DeploymentSpec) -> None:
    """Refuse what no rollout could take, at once rather than at every pass: a version not
    validated, a gate its devices could never feed (``max_drift`` without a reference set,
    ``max_accuracy_drop`` on a version that keeps no predictions...)."""
    model, version = spec.subject()
    mv = await get_version(s, model, version)
    if not (mv.validation or {}).get("passed"):
        raise Conflict(f"{model} v{version} has not passed validation; validate it first")
    refuse_unjudgeable(spec, mv)


@router.post(
    "/deployments",
    status_code=201,
    summary="Bind a model version and its gates to a label selector",
    openapi_extra=json_request(DeploymentSpec),
)
async def create_deployment(
    request: Request,
    spec: DeploymentSpec = NEW_DEPLOYMENT,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    if (await s.execute(select(Deployment.id).where(Deployment.name == spec.name))).first():
        raise Conflict(f"deployment {spec.name!r} exists; change it with PATCH")
    await _check_version(s, spec)
    now = datetime.now(UTC)
    fields = spec.model_dump()
    d = Deployment(**fields, created_by=who.name, created_at=now, updated_at=now)
    s.add(d)
    audit.record(s, who.name, "deployment.create", f"deployment:{spec.name}", **fields)
    await s.commit()
    reconciler(request).wake()
    return json_response(deployment_doc(d, await load_view(s, d.id), None), 201)


@router.get("/deployments", summary="Deployments, with how many devices are in compliance")
async def list_deployments(
    request: Request, s: AsyncSession = SESSION, _: Principal = VIEWER
) -> Response:
    fleet = await load_view(s)
    problems = reconciler(request).problems
    return json_response(
        [deployment_doc(v.deployment, fleet, problems.get(i)) for i, v in fleet.deployments.items()]
    )


@router.get("/deployments/{name}", summary="A deployment and the state of each of its devices")
async def show_deployment(
    request: Request, name: str, s: AsyncSession = SESSION, _: Principal = VIEWER
) -> Response:
    d = await _named(s, name)
    fleet = await load_view(s, d.id)
    problem = reconciler(request).problems.get(d.id)
    return json_response(deployment_doc(d, fleet, problem, devices=True))


@router.patch(
    "/deployments/{name}",
    summary="Change a deployment: a new version is a rollout to its devices",
    openapi_extra=json_request(DeploymentChange),
)
async def change_deployment(
    request: Request,
    name: str,
    change: DeploymentChange = CHANGE,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    d = await _named(s, name)
    try:
        fields = changed(d, change)
    except ValidationError as exc:
        raise Invalid(field_error(exc.errors())) from None
    if fields["version"] != d.version or fields["gates"] != d.gates:
        await _check_version(s, DeploymentSpec.model_validate(fields))
    if fields["version"] != d.version:
        active = (await load_view(s, d.id)).deployments[d.id].active_rollout
        if active is not None:
            raise Busy(
                f"rollout {active} of v{d.version} is still active: let it finish, or cancel "
                "or abort it, before changing the version"
            )
    for key, value in fields.items():
        setattr(d, key, value)
    d.updated_at = datetime.now(UTC)
    audit.record(
        s,
        who.name,
        "deployment.change",
        f"deployment:{name}",
        **change.model_dump(exclude_none=True),
    )
    await s.commit()
    reconciler(request).wake()
    return json_response(deployment_doc(d, await load_view(s, d.id), None, devices=True))


@router.post(
    "/deployments/{name}/{action}",
    summary="pause (no rollout starts, the running one pauses) or resume a deployment",
)
async def pause_or_resume(
    request: Request,
    name: str,
    action: str,
    s: AsyncSession = SESSION,
    who: Principal = OPERATOR,
) -> Response:
    if action not in ("pause", "resume"):
        raise NotFound(f"no action {action!r}: pause or resume")
    d = await _named(s, name)
    active = (await load_view(s, d.id)).deployments[d.id].active_rollout
    state = (
        (await s.execute(select(Rollout.state).where(Rollout.id == active))).scalar_one_or_none()
        if active is not None
        else None
    )
    pausing = action == "pause"
    d.paused_by, d.paused_at = (who.name, datetime.now(UTC)) if pausing else (None, None)
    audit.record(s, who.name, f"deployment.{action}", f"deployment:{name}")
    await s.commit()
    engine = services(request).engine
    # its rollout follows: a running one pauses, one paused (by this or by a gate) goes on
    if active is not None and pausing and state is RolloutState.RUNNING:
        await engine.pause(active, who.name)
    elif active is not None and not pausing and state is RolloutState.PAUSED:
        await engine.resume(active, who.name)
    reconciler(request).wake()
    await s.refresh(d)
    return json_response(deployment_doc(d, await load_view(s, d.id), None, devices=True))


@router.delete("/deployments/{name}", summary="Delete a deployment: devices keep what they run")
async def delete_deployment(
    name: str, s: AsyncSession = SESSION, who: Principal = OPERATOR
) -> Response:
    d = await _named(s, name)
    await s.delete(d)
    audit.record(s, who.name, "deployment.delete", f"deployment:{name}")
    await s.commit()
    return Response(status_code=204)
