"""Session fixtures for the packaging tests: the wheel and sdist from ``python -m build``, and
an offline wheelhouse of edgefleet's dependencies (see wheelhouse.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.packaging.wheelhouse import build_wheelhouse

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """sdist, then the wheel built from that sdist (``build``'s default): so the wheel test
    also proves the sdist holds everything a wheel needs. ``--no-isolation`` uses this
    environment's hatchling instead of downloading one."""
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)]
    subprocess.run(command, check=True, capture_output=True, timeout=170)
    (wheel,) = out.glob("edgefleet-*.whl")
    (sdist,) = out.glob("edgefleet-*.tar.gz")
    return Dist(wheel, sdist)


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))
