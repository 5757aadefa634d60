"""Where each model of a repository runs on this machine, and why."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.model_config import ModelConfigError, load_model_config, version_dirs
from runtimes.errors import RuntimeFailure
from runtimes.formats import ModelFormat, find_model_file
from runtimes.hardware.context import HardwareContext
from runtimes.hardware.select import Plan


@dataclass(frozen=True)
class ModelPlan:
    model: str
    version: str | None
    model_file: Path | None
    format: ModelFormat | None
    plan: Plan | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {
            "model": self.model,
            "version": self.version,
            "model_file": str(self.model_file) if self.model_file else None,
            "format": self.format.value if self.format else None,
            "placement": p.placement.model_dump() if p else None,
            "pinned": p.pinned if p else False,
            "skipped": [{"candidate": s.candidate, "reason": s.reason} for s in p.skipped]
            if p
            else [],
            "error": self.error,
        }


def plan_repository(repository: Path, context: HardwareContext) -> list[ModelPlan]:
    """Plan the newest version of every model under ``repository``."""
    plans = []
    for model_dir in sorted(
        p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")
    ):
        name = model_dir.name
        versions = version_dirs(model_dir)
        if not versions:
            plans.append(ModelPlan(name, None, None, None, None, "no numeric version directory"))
            continue
        version_dir = versions[-1]
        try:
            config = load_model_config(model_dir)
            model_file, fmt = find_model_file(version_dir)
            plan = context.plan(name, fmt, config.placement)
        except (RuntimeFailure, ModelConfigError) as exc:
            plans.append(ModelPlan(name, version_dir.name, None, None, None, str(exc)))
            continue
        plans.append(ModelPlan(name, version_dir.name, model_file, fmt, plan))
    return plans
