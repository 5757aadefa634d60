"""Settings from defaults, then an optional TOML file, then the environment, then flags.

Each process has one root settings class (``AgentSettings``, ``ControlPlaneSettings``); this
module only builds one from its sources.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic_settings import BaseSettings, SettingsConfigDict

S = TypeVar("S", bound=BaseSettings)


def settings_from(cls: type[S], config_file: Path | None = None, **overrides: object) -> S:
    """Build ``cls``; a TOML file is read under the environment, flags (``overrides``) win.

    Raises:
        FileNotFoundError: ``config_file`` was given and does not exist.
    """
    if config_file is not None:
        if not config_file.is_file():
            raise FileNotFoundError(f"settings file {config_file} does not exist")
        cls = type(
            cls.__name__, (cls,), {"model_config": SettingsConfigDict(toml_file=config_file)}
        )
    return cls(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
