"""Placement: for each model, the first profile candidate that can run it here, with the
reason every earlier candidate was skipped."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from runtimes.backends.openvino_backend import missing_devices
from runtimes.base import Placement, RuntimeName
from runtimes.errors import NoPlacementError
from runtimes.formats import ModelFormat
from runtimes.hardware.probe import MachineFacts
from runtimes.hardware.profile import Candidate, HardwareProfile
from runtimes.inventory import RuntimeInventory


class Pin(BaseModel):
    """A user's choice of runtime (and optionally device) for one model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: RuntimeName
    device: str | None = None
    providers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Skipped:
    candidate: str
    reason: str

    def __str__(self) -> str:
        return f"{self.candidate}: {self.reason}"


@dataclass(frozen=True)
class Plan:
    model: str
    format: ModelFormat
    placement: Placement
    skipped: tuple[Skipped, ...]
    pinned: bool = False


def check_candidate(
    candidate: Candidate, fmt: ModelFormat, facts: MachineFacts, inventory: RuntimeInventory
) -> Placement | str:
    """The placement if ``candidate`` is usable here, otherwise why not."""
    from runtimes.backends import BACKENDS

    if fmt not in BACKENDS[candidate.runtime].formats:
        return f"{candidate.runtime} cannot run {fmt.value} models"
    info = inventory.get(candidate.runtime)
    if not info.installed:
        return f"{candidate.runtime} is {info.missing_reason}"
    if candidate.requires_any and not any(facts.present(t) for t in candidate.requires_any):
        return "no " + " or ".join(candidate.requires_any)
    if candidate.runtime == "onnxruntime":
        usable = tuple(p for p in candidate.providers if p in info.devices)
        if not usable:
            return (
                f"{', '.join(candidate.providers)} not in this onnxruntime build "
                f"(it has {', '.join(sorted(info.devices))})"
            )
        return candidate.placement(providers=usable)
    if candidate.runtime == "openvino":
        # The backend checks again with the same rule when it loads the model.
        missing = missing_devices(candidate.device, info.devices)
        if missing:
            return (
                f"OpenVINO reports no {' or '.join(missing)} device "
                f"(it has {', '.join(sorted(info.devices))})"
            )
        return candidate.placement()
    if candidate.delegate and candidate.delegate not in inventory.delegate_libraries:
        return f"delegate library {candidate.delegate} does not load"
    return candidate.placement()


def plan_model(
    model: str,
    fmt: ModelFormat,
    profile: HardwareProfile,
    facts: MachineFacts,
    inventory: RuntimeInventory,
    pin: Pin | None = None,
    failed: Mapping[str, str] | None = None,
) -> Plan:
    """Choose where ``model`` runs. ``failed`` maps placements already tried (as
    :meth:`Placement.describe` gives them) to why they did not load: they are skipped for that
    reason, and the next candidate is chosen.

    Raises:
        NoPlacementError: nothing fits, or the pinned placement cannot be used; the message
            names every candidate tried and why it was skipped.
    """
    if pin is not None:
        candidate = _pinned_candidate(pin, fmt, profile)
        result = check_candidate(candidate, fmt, facts, inventory)
        if isinstance(result, str):
            raise NoPlacementError(
                f"model {model!r} is pinned to {candidate.describe()}, "
                f"which cannot be used: {result}"
            )
        return Plan(model, fmt, result, (), pinned=True)
    skipped: list[Skipped] = []
    for candidate in profile.preferences.get(fmt, ()):
        result = check_candidate(candidate, fmt, facts, inventory)
        if isinstance(result, Placement) and failed and result.describe() in failed:
            result = f"failed to load: {failed[result.describe()]}"
        if isinstance(result, Placement):
            return Plan(model, fmt, result, tuple(skipped))
        skipped.append(Skipped(candidate.describe(), result))
    tried = "; ".join(map(str, skipped)) or f"the profile lists no candidate for {fmt.value}"
    raise NoPlacementError(
        f"no runtime of profile {profile.name} can run model {model!r} ({fmt.value}): {tried}"
    )


def _pinned_candidate(pin: Pin, fmt: ModelFormat, profile: HardwareProfile) -> Candidate:
    """The profile's candidate for the pin (with its options), or one built from the pin."""
    for c in profile.preferences.get(fmt, ()):
        if c.runtime == pin.runtime and (pin.device is None or c.device == pin.device):
            return c if not pin.providers else c.model_copy(update={"providers": pin.providers})
    device = pin.device or "CPU"
    providers = pin.providers
    if pin.runtime == "onnxruntime" and not providers:
        if device != "CPU":
            raise NoPlacementError(
                f"pin onnxruntime {device}: name its providers, the profile "
                f"{profile.name} has no such candidate"
            )
        providers = ("CPUExecutionProvider",)
    return Candidate(runtime=pin.runtime, device=device, providers=providers)
