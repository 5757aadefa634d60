"""The config twin on the device: which settings the fleet may set, how they apply, and
what the device reports back (:mod:`common.protocol.twin` is the wire).

A setting is *live* when this agent reads it at each use (the telemetry timer, the log
level): it takes effect on receipt. Others are read once at start (the HTTP server's request
limit): accepted, kept, shown as ``pending_restart`` until the agent starts again, when
:func:`with_twin` lays the kept twin over the settings before anything is built. An unknown
name or a bad value is refused with its reason and the rest of the twin applies.

The twin applied is kept in ``state_dir/twin.json``: a restart without network runs with it.
Application keys (``app``) are served to apps by ``GET /v2/edgefleet/config``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from common.files import write_atomically
from common.protocol.signing import canonical_bytes
from common.protocol.twin import MAX_APP_BYTES, ConfigTwin, TwinReport

if TYPE_CHECKING:
    from agent.fleet.settings import FleetSettings
    from agent.settings import AgentSettings

log = logging.getLogger("edgefleet.agent.fleet.twin")
TWIN_FILE = "twin.json"


@dataclass(frozen=True)
class TwinSetting:
    path: tuple[str, ...]
    """Where it lives in the agent's settings (``("fleet", "telemetry_interval_s")``)."""
    adapter: TypeAdapter[Any]
    live: bool


SETTINGS: dict[str, TwinSetting] = {
    "telemetry_interval_s": TwinSetting(
        ("fleet", "telemetry_interval_s"),
        TypeAdapter(Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False, strict=True)]),
        live=True,
    ),
    "log_level": TwinSetting(
        ("log_level",), TypeAdapter(Literal["DEBUG", "INFO", "WARNING", "ERROR"]), live=True
    ),
    "max_request_bytes": TwinSetting(
        ("max_request_bytes",), TypeAdapter(Annotated[int, Field(gt=0, strict=True)]), live=False
    ),
}
"""The settings a twin may set. Each is a setting of the agent's own (docs/operations.md,
"Per-device configuration (the twin)")."""


class AppliedTwin(BaseModel):
    """``twin.json``: the last twin verified, as applied."""

    model_config = ConfigDict(extra="forbid")

    version: int
    settings: dict[str, Any] = Field(default_factory=dict)
    """The settings accepted, live and at restart."""
    app: dict[str, Any] = Field(default_factory=dict)
    rejected: dict[str, str] = Field(default_factory=dict)


def load_applied(state_dir: Path) -> AppliedTwin | None:
    path = state_dir / TWIN_FILE
    try:
        return AppliedTwin.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:  # a file no agent of ours wrote: the fleet sends the twin again
        log.warning("config twin file unreadable; ignored", extra={"path": str(path)})
        return None


def with_twin(settings: AgentSettings) -> AgentSettings:
    """``settings`` with the kept twin's settings laid over them (at start, before any part
    is built: the settings that apply only at start take effect here)."""
    applied = load_applied(settings.fleet.state_dir) if settings.fleet.enabled else None
    if applied is None:
        return settings
    fleet: dict[str, Any] = {}
    top: dict[str, Any] = {}
    for name, value in applied.settings.items():
        spec = SETTINGS.get(name)
        if spec is not None:
            (fleet if spec.path[0] == "fleet" else top)[spec.path[-1]] = value
    if fleet:
        top["fleet"] = settings.fleet.model_copy(update=fleet)
    return settings.model_copy(update=top)


def running_settings(settings: AgentSettings) -> dict[str, Any]:
    """Each twin setting's value in ``settings`` (those the agent started with)."""
    running = {}
    for name, spec in SETTINGS.items():
        value: Any = settings
        for part in spec.path:
            value = getattr(value, part)
        running[name] = value
    return running


def validated(twin: ConfigTwin) -> tuple[dict[str, Any], dict[str, str]]:
    """The twin's settings accepted, and those refused with why."""
    accepted: dict[str, Any] = {}
    rejected: dict[str, str] = {}
    for name, value in twin.settings.items():
        spec = SETTINGS.get(name)
        if spec is None:
            rejected[name] = f"unknown setting (this agent takes {', '.join(sorted(SETTINGS))})"
            continue
        try:
            accepted[name] = spec.adapter.validate_python(value)
        except ValidationError as exc:
            rejected[name] = f"bad value {value!r}: {exc.errors()[0]['msg']}"
    return accepted, rejected


class TwinKeeper:
    """The twin this device applied, and the values of its settings in effect now."""

    def __init__(self, state_dir: Path, running: dict[str, Any]) -> None:
        """``running``: each setting's value as this agent started with it."""
        self.path = state_dir / TWIN_FILE
        self.running = dict(running)
        self.applied = load_applied(state_dir)

    @classmethod
    def of_fleet(cls, settings: FleetSettings) -> TwinKeeper:
        """A keeper of the fleet settings' own twin settings only (an agent built without
        :func:`running_settings`)."""
        return cls(settings.state_dir, {"telemetry_interval_s": settings.telemetry_interval_s})

    @property
    def version(self) -> int | None:
        return self.applied.version if self.applied else None

    @property
    def app(self) -> dict[str, Any]:
        return dict(self.applied.app) if self.applied else {}

    def apply(self, twin: ConfigTwin) -> AppliedTwin:
        """Apply what is live now, keep the rest for the next start, and remember it all."""
        accepted, rejected = validated(twin)
        app = twin.app
        if len(canonical_bytes(app)) > MAX_APP_BYTES:
            rejected["app"] = f"application keys exceed {MAX_APP_BYTES} bytes"
            app = self.app
        for name, value in accepted.items():
            if SETTINGS[name].live:
                self._apply_live(name, value)
        self.applied = AppliedTwin(
            version=twin.version, settings=accepted, app=app, rejected=rejected
        )
        write_atomically(self.path, self.applied.model_dump_json().encode())
        return self.applied

    def _apply_live(self, name: str, value: Any) -> None:
        if name == "log_level":
            logging.getLogger().setLevel(value)
        self.running[name] = value  # telemetry_interval_s: read by the timer at each round

    def report(self) -> TwinReport | None:
        applied = self.applied
        if applied is None:
            return None
        reported: dict[str, Any] = {n: self.running.get(n) for n in applied.settings}
        reported["app"] = applied.app
        pending = {
            name: value
            for name, value in applied.settings.items()
            if not SETTINGS[name].live and self.running.get(name) != value
        }
        return TwinReport(
            version=applied.version,
            reported=reported,
            pending_restart=pending,
            rejected=dict(applied.rejected),
        )
