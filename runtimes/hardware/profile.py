"""Hardware profiles (``hardware_profiles/*.toml``) validated into pydantic models."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from runtimes.base import Placement, RuntimeName
from runtimes.errors import ProfileError, validation_message
from runtimes.formats import ModelFormat

# A presence token is a path (glob allowed, read under the probe's root) or "usb:VVVV:PPPP".
PresenceToken = str


class MatchRules(BaseModel):
    """When a profile describes the machine. Each list is "any of"; the fields all apply."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    architectures: tuple[str, ...] = ()
    """CPU architectures as the kernel names them (x86_64, aarch64, armv7l)."""
    cpu_model: tuple[str, ...] = ()
    """Substrings of the CPU model name in /proc/cpuinfo (case-insensitive)."""
    device_tree_model: tuple[str, ...] = ()
    """Substrings of /proc/device-tree/model (case-insensitive)."""
    all_present: tuple[PresenceToken, ...] = ()
    """Every one of these files, device nodes or USB ids exists."""
    any_present: tuple[PresenceToken, ...] = ()
    """At least one of these files, device nodes or USB ids exists."""


class Candidate(BaseModel):
    """One preference: a runtime on a device, with what it needs to be usable."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: RuntimeName
    device: str = "CPU"
    providers: tuple[str, ...] = ()
    provider_options: dict[str, dict[str, str]] = Field(default_factory=dict)
    delegate: str | None = None
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    requires_any: tuple[PresenceToken, ...] = ()
    """The device is present only if one of these exists (e.g. /dev/accel/accel0)."""

    @model_validator(mode="after")
    def _fields_fit_runtime(self) -> Candidate:
        if (self.providers or self.provider_options) and self.runtime != "onnxruntime":
            raise ValueError("providers and provider_options apply to onnxruntime only")
        if self.delegate and self.runtime != "litert":
            raise ValueError("delegate applies to litert only")
        if self.runtime == "onnxruntime" and not self.providers:
            raise ValueError("an onnxruntime candidate lists its execution providers")
        for provider in self.provider_options:
            # Options for a provider the candidate does not use are a typo in one or the other.
            if provider not in self.providers:
                raise _field_error(
                    ("provider_options", provider),
                    f"{provider} is not in providers ({', '.join(self.providers)})",
                    self.provider_options[provider],
                )
        return self

    def describe(self) -> str:
        return f"{self.runtime} {self.device}"

    def placement(self, providers: tuple[str, ...] | None = None) -> Placement:
        return Placement(
            runtime=self.runtime,
            device=self.device,
            providers=self.providers if providers is None else providers,
            provider_options=self.provider_options,
            delegate=self.delegate,
            options=dict(self.options),
        )


class HardwareProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str
    priority: int = 0
    """When several profiles match, the highest priority wins (generic ones are 0)."""
    match: MatchRules
    memory_budget_mb: int | None = Field(default=None, gt=0)
    """Memory models may use, in MiB; the smaller of this and the fraction applies."""
    memory_budget_fraction: float = Field(default=0.75, gt=0, le=1)
    """Share of physical memory models may use."""
    preferences: dict[ModelFormat, tuple[Candidate, ...]]
    """Per model format, candidates in order of preference (NPU > GPU > CPU)."""

    @model_validator(mode="after")
    def _candidates_fit_formats(self) -> HardwareProfile:
        from runtimes.backends import BACKENDS

        for fmt, candidates in self.preferences.items():
            for i, c in enumerate(candidates):
                if fmt not in BACKENDS[c.runtime].formats:
                    raise _field_error(
                        ("preferences", fmt.value, i, "runtime"),
                        f"{c.runtime} cannot run {fmt.value} models",
                        c.runtime,
                    )
        return self

    def memory_budget_bytes(self, memory_total_bytes: int | None) -> int | None:
        limits = []
        if self.memory_budget_mb is not None:
            limits.append(self.memory_budget_mb * 2**20)
        if memory_total_bytes:
            limits.append(int(memory_total_bytes * self.memory_budget_fraction))
        return min(limits) if limits else None


def _field_error(loc: tuple[str | int, ...], message: str, value: Any) -> ValidationError:
    """A validation error at ``loc`` within the model being validated, for checks that span
    fields; pydantic prefixes where that model sits (``preferences.onnx.0``), so a
    :class:`ProfileError` names the field as it does for a wrong type."""
    error = PydanticCustomError("profile_field", "{message}", {"message": message})
    return ValidationError.from_exception_data(
        "HardwareProfile", [InitErrorDetails(type=error, loc=loc, input=value)]
    )


def load_profile(path: Path) -> HardwareProfile:
    """Read one profile; any problem is a :class:`ProfileError` naming the file and field."""
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: invalid TOML: {exc}") from exc
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{path}: {validation_message(exc)}") from exc


def load_profiles(directory: Path) -> list[HardwareProfile]:
    files = sorted(directory.glob("*.toml"))
    if not files:
        raise ProfileError(f"{directory}: no hardware profiles (*.toml)")
    profiles = [load_profile(f) for f in files]
    seen: dict[str, Path] = {}
    for path, profile in zip(files, profiles, strict=True):
        if profile.name in seen:
            raise ProfileError(
                f"{path}: field name: {profile.name!r} is also used by {seen[profile.name]}"
            )
        seen[profile.name] = path
    return profiles


def default_profiles_dir() -> Path:
    """Profiles shipped in the wheel, or the checkout's ``hardware_profiles/``."""
    packaged = Path(__file__).parent / "profiles"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "hardware_profiles"
