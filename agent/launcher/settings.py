"""The launcher's settings (``EDGEFLEET_LAUNCHER_*``, or a TOML file): where releases live,
how the agent is started, and the trial's and the back-off's timings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


class LauncherSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EDGEFLEET_LAUNCHER_", frozen=True, extra="forbid")

    root_dir: Path = Path("/var/lib/edgefleet/launcher")
    """Releases side by side (``releases/<version>/``), the journal ``launcher.json`` and
    the notify socket live here."""
    agent_args: list[str] = Field(default_factory=lambda: ["agent"])
    """The ``edgefleet`` command line the launcher runs in each release (the same for all)."""
    ready_timeout_s: float = Field(default=120.0, gt=0)
    """A release on trial must send READY=1 within this long after it starts."""
    trial_window_s: float = Field(default=60.0, ge=0)
    """...and then stay up this long before it is committed."""
    trial_max_launches: int = Field(default=3, ge=1)
    """Failed launches of a release on trial before the launcher goes back to ``previous``.
    A launch the launcher did not see end (a kill -9 of the launcher) counts as failed."""
    backoff_initial_s: float = Field(default=1.0, gt=0)
    """The wait before the first restart of an agent that exited; doubled on each exit in a
    row."""
    backoff_max_s: float = Field(default=60.0, gt=0)
    """The back-off's cap: the launcher never gives up, it waits at most this long."""
    stable_after_s: float = Field(default=60.0, ge=0)
    """An agent up this long after READY=1 ends a crash loop: the back-off starts again at
    ``backoff_initial_s``."""
    stop_grace_s: float = Field(default=60.0, gt=0)
    """On SIGTERM (or a switch of release) the agent gets this long to finish in-flight
    requests before SIGKILL."""
    child_watchdog_s: float = Field(default=0.0, ge=0)
    """Hand the agent WATCHDOG_USEC for this long and restart it when its pings stop
    (0: off). Under systemd's ``WatchdogSec=`` the launcher pings systemd itself."""
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _backoff_order(self) -> LauncherSettings:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be at least backoff_initial_s")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # flags, then the environment, then the TOML file (when one is named)
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    @property
    def releases_dir(self) -> Path:
        return self.root_dir / "releases"

    @property
    def journal_file(self) -> Path:
        return self.root_dir / "launcher.json"
