"""Per-model configuration: ``DIR/<model>/config.toml`` in a model repository."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from runtimes.errors import validation_message
from runtimes.hardware.select import Pin

CONFIG_FILE = "config.toml"


class ModelConfigError(ValueError):
    """A model's config.toml is unreadable or invalid; the message names file and field."""

    code = "model_config_invalid"


class ModelConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    description: str = ""
    """Free text shown in metadata."""

    placement: Pin | None = None
    """Pin the model to a runtime (and device) instead of the profile's preference order."""


def load_model_config(model_dir: Path) -> ModelConfig:
    path = model_dir / CONFIG_FILE
    if not path.is_file():
        return ModelConfig()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ModelConfigError(f"{path}: cannot read: {exc}") from exc
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise ModelConfigError(f"{path}: {validation_message(exc)}") from exc


def version_dirs(model_dir: Path) -> list[Path]:
    """Numeric version directories of a model, oldest first."""
    versions = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(versions, key=lambda p: int(p.name))
