"""What an operator asks of a deployment: a rollout's spec (model, version, selector, waves,
gates) with a name and a priority; and what may change afterwards."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from control_plane.db.models import NAME_LENGTH, Deployment
from control_plane.rollouts.spec import Gates, RolloutSpec

LATE_WAVES = ["100%"]
"""The waves of a rollout for devices that came to a deployment after its version's first."""


class DeploymentSpec(RolloutSpec):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=NAME_LENGTH)
    priority: int = Field(default=0, ge=-1000, le=1000)
    """Of two deployments of one model that match a device, the higher wins (a tie: the
    newer)."""
    agent_version: None = Field(default=None, exclude=True)
    """A deployment is of a model version: an agent release goes out by a rollout."""
    shadow: None = Field(default=None, exclude=True)
    """A deployment has no shadow phase: its devices converge on their own, with no operator
    watching a wave. Given, it is a 400 naming the field (a rollout takes one)."""


class DeploymentChange(BaseModel):
    """Fields to change; a new ``version`` is a rollout to every device of the deployment."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    version: int | None = Field(default=None, ge=1, le=2**31 - 1)
    selector: dict[str, str] | None = None
    profiles: list[str] | None = None
    priority: int | None = Field(default=None, ge=-1000, le=1000)
    waves: list[str] | None = None
    bake_time_s: float | None = None
    device_timeout_s: float | None = None
    gates: Gates | None = None


def rollout_spec(d: Deployment, *, late: bool) -> RolloutSpec:
    """The rollout spec of ``d``'s version: its own waves for the first rollout of a version,
    one wave for the devices that came later."""
    return RolloutSpec(
        model=d.model,
        version=d.version,
        selector=d.selector,
        profiles=d.profiles,
        waves=LATE_WAVES if late else d.waves,
        bake_time_s=d.bake_time_s,
        device_timeout_s=d.device_timeout_s,
        gates=Gates.model_validate(d.gates),
    )


def changed(d: Deployment, change: DeploymentChange) -> dict[str, Any]:
    """``d``'s fields after ``change``, validated as a whole (a wave list, a duration).

    Raises:
        pydantic.ValidationError: the result is not a valid deployment.
    """
    current = {
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
    }
    updates = change.model_dump(exclude_none=True)
    return DeploymentSpec.model_validate({**current, **updates}).model_dump()
