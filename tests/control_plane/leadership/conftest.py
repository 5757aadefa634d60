"""Fixtures of the replica tests: a directory the broker ``fleet init`` writes can read."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """Reachable by the mosquitto user a broker started by root drops to (pytest's own
    temporary directories are mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="edgefleet-replicas-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
