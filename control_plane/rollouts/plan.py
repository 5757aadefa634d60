"""A rollout's rows as it is created: the checks that refuse it, its targets and their waves,
and the manifest stored once for every device (:meth:`RolloutEngine.create
<control_plane.rollouts.engine.RolloutEngine.create>` runs it under the engine's lock)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from common.pipeline_config import PIPELINE_FILE
from control_plane.db.models import (
    AGENT_KEY,
    Device,
    Model,
    ModelVersion,
    Rollout,
    RolloutDevice,
)
from control_plane.db.states import ACTIVE, DeviceRolloutState, RolloutState
from control_plane.errors import Busy, Conflict, Invalid
from control_plane.registry.agent_releases import get_release
from control_plane.registry.store import get_version
from control_plane.rollouts.agent import build_agent_manifest
from control_plane.rollouts.events import CHUNK
from control_plane.rollouts.manifests import build_manifest
from control_plane.rollouts.spec import RolloutSpec, wave_bounds
from runtimes.formats import GENAI_FORMAT

"""Rollout states that still act on their devices."""


async def plan_rollout(
    session: AsyncSession,
    spec: RolloutSpec,
    user: str,
    *,
    artifact_base_url: str,
    manifest_ttl_s: float,
    only: Collection[str] | None = None,
    deployment_id: int | None = None,
) -> int:
    """Add a running rollout of ``spec`` and a pending row per device of its waves, in
    ``session``'s transaction; return its id. ``only``: of the matching devices, these alone
    (a continuous deployment's devices that joined later); ``deployment_id``: the deployment
    that starts it.

    Raises:
        NotFound: no such model version, or agent release.
        Conflict: the version was not validated, or failed validation.
        Invalid: no device matches the selector and profiles; a gate the devices cannot
            feed (:func:`refuse_unjudgeable`).
        Busy: an active rollout of the model holds one of the devices.
    """
    if spec.agent_version is not None:
        return await _plan_agent(
            session,
            spec,
            user,
            spec.agent_version,
            artifact_base_url=artifact_base_url,
            manifest_ttl_s=manifest_ttl_s,
            only=only,
            deployment_id=deployment_id,
        )
    name, version = spec.subject()
    mv = await get_version(session, name, version)
    refuse_unjudgeable(spec, mv)
    report = mv.validation
    if report is None:
        raise Conflict(f"{name} v{version} has not been validated; validate it first")
    if not report.get("passed"):
        raise Conflict(f"{name} v{version} failed validation; it cannot be rolled out")
    if mv.stage == "archived":
        raise Conflict(f"{name} v{version} is archived; set another stage to roll it out")
    targets = await _targets(session, spec, name, only)
    if deployment_id is None:  # a deployment's rollout to joining devices waits instead
        refuse_no_baseline(spec, targets)
    model = (
        await session.execute(select(Model).where(Model.name == name).with_for_update())
    ).scalar_one()
    sequence = model.next_sequence
    model.next_sequence += 1
    rollout = await _add_rollout(
        session, spec, user, name, version, sequence, targets, deployment_id=deployment_id
    )
    # The manifest without its target, stored once; each device gets it signed for itself
    # alone when its wave starts (RolloutEngine._send). One manifest naming every target would
    # make every device's desired state grow with the fleet: N devices x N ids.
    rollout.manifest = build_manifest(
        mv,
        sequence=sequence,
        base_url=artifact_base_url,
        rollout_id=f"rollout-{rollout.id}",
        now=rollout.created_at,
        ttl_s=manifest_ttl_s,
    ).model_dump(mode="json")
    return rollout.id


async def _plan_agent(
    session: AsyncSession,
    spec: RolloutSpec,
    user: str,
    agent_version: str,
    *,
    artifact_base_url: str,
    manifest_ttl_s: float,
    only: Collection[str] | None,
    deployment_id: int | None,
) -> int:
    """An agent release's rollout: ``model`` is :data:`AGENT_KEY`, ``version`` and
    ``sequence`` the release's sequence (control_plane/rollouts/agent.py)."""
    release = await get_release(session, agent_version)
    targets = await _targets(session, spec, AGENT_KEY, only)
    rollout = await _add_rollout(
        session,
        spec,
        user,
        AGENT_KEY,
        release.sequence,
        release.sequence,
        targets,
        deployment_id=deployment_id,
        agent_version=release.version,
    )
    rollout.manifest = build_agent_manifest(
        release,
        base_url=artifact_base_url,
        rollout_id=f"rollout-{rollout.id}",
        now=rollout.created_at,
        ttl_s=manifest_ttl_s,
    ).model_dump(mode="json")
    return rollout.id


async def _targets(
    session: AsyncSession, spec: RolloutSpec, key: str, only: Collection[str] | None
) -> list[Device]:
    """The rollout's devices, refused when there are none or another active rollout of
    ``key`` holds one."""
    targets = await matching_devices(session, spec)
    if only is not None:
        targets = [d for d in targets if d.id in only]
    if not targets:
        raise Invalid("selector: no device matches the selector and profiles")
    await refuse_overlap(session, key, [d.id for d in targets])
    return targets


async def _add_rollout(
    session: AsyncSession,
    spec: RolloutSpec,
    user: str,
    key: str,
    version: int,
    sequence: int,
    targets: list[Device],
    *,
    deployment_id: int | None,
    agent_version: str | None = None,
) -> Rollout:
    """The running rollout of ``key`` (a model's name, or :data:`AGENT_KEY`) and a pending row
    per device of its waves; its manifest is the caller's to set."""
    now = datetime.now(UTC)
    rollout = Rollout(
        model=key,
        version=version,
        sequence=sequence,
        manifest={},
        selector=spec.selector,
        profiles=spec.profiles,
        waves=spec.waves,
        bake_time_s=spec.bake_time_s,
        device_timeout_s=spec.device_timeout_s,
        gates=spec.gates.model_dump(),
        state=RolloutState.RUNNING,
        current_wave=0,
        reason="",
        gate_report={},
        created_by=user,
        created_at=now,
        updated_at=now,
        deployment_id=deployment_id,
        shadow=None if spec.shadow is None else {"spec": spec.shadow.model_dump(), "waves": {}},
        agent_version=agent_version,
    )
    session.add(rollout)
    await session.flush()
    bounds = wave_bounds(spec.waves, len(targets))
    rows = []
    for position, device in enumerate(targets[: bounds[-1]]):  # beyond the last wave: untouched
        wave = next(i for i, b in enumerate(bounds) if position < b)
        served = {m["model"]: m["version"] for m in device.models}
        rows.append(
            {
                "rollout_id": rollout.id,
                "device_id": device.id,
                "position": position,
                "wave": wave,
                "state": DeviceRolloutState.PENDING,
                "previous_version": served.get(key),
                "previous_desired": device.desired.get(key),
                "reason": "",
            }
        )
    # one bulk INSERT (rows many to a statement), not an object per row through the unit of
    # work: a rollout to 20,000 devices spent seconds there before its first manifest went out
    if rows:
        await session.execute(insert(RolloutDevice), rows)
    return rollout


async def refuse_overlap(session: AsyncSession, model: str, device_ids: list[str]) -> None:
    """Two active rollouts of one model on one device would overwrite each other's desired
    state (the older one's rollback would restore what the newer replaced) and share its
    answers to rollback commands, which name the model, not the rollout.

    Raises:
        Busy: naming the active rollout and the first device it holds.
    """
    query = select(Rollout.id).where(Rollout.model == model, Rollout.state.in_(ACTIVE))
    active = (await session.execute(query)).scalars().all()
    if not active:
        return
    for start in range(0, len(device_ids), CHUNK):
        clash = (
            await session.execute(
                select(RolloutDevice.rollout_id, RolloutDevice.device_id)
                .where(
                    RolloutDevice.rollout_id.in_(active),
                    RolloutDevice.device_id.in_(device_ids[start : start + CHUNK]),
                )
                .limit(1)
            )
        ).first()
        if clash is not None:
            raise Busy(
                f"rollout {clash[0]} of {model} is still active on {clash[1]} (and maybe "
                "others of these devices): let it finish, cancel or abort it first"
            )


async def matching_devices(session: AsyncSession, spec: RolloutSpec) -> list[Device]:
    """The devices of the selector's labels and the spec's profiles, by id."""
    devices = (await session.execute(select(Device).order_by(Device.id))).scalars().all()
    return [
        d
        for d in devices
        if all(d.labels.get(k) == v for k, v in spec.selector.items())
        and (not spec.profiles or d.hardware_profile in spec.profiles)
    ]


def refuse_no_baseline(spec: RolloutSpec, targets: list[Device]) -> None:
    """``max_accuracy_drop`` compares with the version the rollout replaces: with no target
    serving another version of the model, it could never judge.

    Raises:
        Invalid: naming the gate.
    """
    if spec.gates.max_accuracy_drop is None:
        return
    model, version = spec.subject()
    served = [m["version"] for d in targets for m in d.models if m["model"] == model]
    if not any(v != version for v in served):
        raise Invalid(
            f"gates.max_accuracy_drop: no targeted device serves another version of "
            f"{model}, so there is no live baseline to compare v{version}'s "
            "accuracy with; leave max_accuracy_drop out of a first rollout"
        )


def refuse_unjudgeable(spec: RolloutSpec, mv: ModelVersion) -> None:
    """Refuse a gate the devices cannot feed: it would hold every wave until its timeout.

    Raises:
        Invalid: naming the gate and why.
    """
    model, version = spec.subject()
    name = f"{model} v{version}"
    pipeline = any(f.get("name") == PIPELINE_FILE for v in mv.variants for f in v.get("files", []))
    generative = any(v.get("format") == GENAI_FORMAT for v in mv.variants)
    for gate, given in (
        ("shadow", spec.shadow is not None),
        ("gates.max_drift", spec.gates.max_drift is not None),
        ("gates.max_accuracy_drop", spec.gates.max_accuracy_drop is not None),
    ):
        if given and pipeline and gate != "gates.max_drift":  # sketched at its model
            raise Invalid(
                f"{gate}: {name} is a pipeline; devices neither shadow nor keep the "
                "predictions of pipelines, so this gate could never judge"
            )
        if given and generative:
            raise Invalid(
                f"{gate}: {name} is a generative model; devices neither shadow, sketch the "
                "prompts of nor keep the predictions of generative models, so this gate "
                "could never judge; gate it on "
                "max_ttft_p99_ms and max_inter_token_p99_ms"
            )
    truth = mv.config.get("ground_truth")
    if spec.gates.max_accuracy_drop is not None and not (
        isinstance(truth, dict) and truth.get("task")
    ):
        raise Invalid(
            f"gates.max_accuracy_drop: {name} sets no [ground_truth] task in its config, so "
            "devices keep none of its predictions and no outcome can judge it; push it with "
            "a config that sets one, or leave max_accuracy_drop out"
        )
    if spec.gates.max_drift is not None and mv.reference is None:
        raise Invalid(
            f"gates.max_drift: {name} has no reference set to judge input drift against; "
            "push it with --reference, or leave max_drift out"
        )
    made = (mv.validation or {}).get("model_reference")
    if spec.gates.max_drift is not None and pipeline and not made:
        raise Invalid(
            f"gates.max_drift: {name} is a pipeline, sketched at its model step, and its "
            "reference set has not been run through its steps; validate it again"
        )
    for gate in ("max_ttft_p99_ms", "max_inter_token_p99_ms"):
        if getattr(spec.gates, gate) is not None and not generative:
            raise Invalid(
                f"gates.{gate}: {name} is not a generative model; it generates no tokens, so "
                "this gate could never judge"
            )
