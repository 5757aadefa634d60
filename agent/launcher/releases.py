"""Releases side by side under ``releases/<version>/``, each an importable tree:

- ``release.json``: ``{"version": ..., "entry": "common.cli", "python": null}``;
- ``lib/``: the packages of that agent release (put first on ``PYTHONPATH``, so they win over
  the ones installed beside the launcher);
- optionally its own interpreter and environment (``"python": "venv/bin/python"``, built
  offline from a wheelhouse).

The child is ``<python> -P -m <entry> <agent_args...>`` (``-P``: the working directory is
not put on the path, so only the release's ``lib/`` and its environment are). A release is
installed by copying (or unpacking a ``.tar.gz``) into ``releases/.staging-*`` and renaming
that folder into place, so a release folder is either whole or absent; a kill -9 leaves at
most a staging folder, removed on the next start.
"""

from __future__ import annotations

import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agent.launcher.journal import BASE, VERSION_PATTERN
from common.files import fsync_path

RELEASE_FILE = "release.json"
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class ReleaseError(Exception):
    """A release that cannot be installed or started; the message says which and why."""


class ReleaseInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = Field(pattern=VERSION_PATTERN.pattern)
    entry: str = Field(default="common.cli", pattern=_MODULE.pattern)
    """The module run with ``python -m``."""
    python: str | None = None
    """The release's own interpreter, relative to its folder; None: the launcher's."""

    @field_validator("version")
    @classmethod
    def _not_base(cls, value: str) -> str:
        if value == BASE:
            raise ValueError(f"{BASE!r} names the agent installed with the launcher")
        return value

    @field_validator("python")
    @classmethod
    def _inside(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("/") or ".." in Path(value).parts):
            raise ValueError("python must be a path inside the release")
        return value


def read_info(folder: Path) -> ReleaseInfo:
    try:
        return ReleaseInfo.model_validate_json((folder / RELEASE_FILE).read_bytes())
    except FileNotFoundError as exc:
        raise ReleaseError(f"{folder}: no {RELEASE_FILE}") from exc
    except (ValidationError, OSError) as exc:
        raise ReleaseError(f"{folder / RELEASE_FILE}: {exc}") from exc


class Releases:
    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def path(self, version: str) -> Path:
        return self.dir / version

    def installed(self, version: str) -> bool:
        return version == BASE or (self.path(version) / RELEASE_FILE).is_file()

    def clean_staging(self) -> list[str]:
        """Remove the staging folders an interrupted install left; their names."""
        left = sorted(p for p in self.dir.glob(".staging-*") if p.is_dir())
        for folder in left:
            shutil.rmtree(folder)
        return [p.name for p in left]

    def install(self, source: Path) -> ReleaseInfo:
        """Install a release tree (a folder, or a ``.tar.gz`` of one) side by side.

        Raises:
            ReleaseError: the source is no release, or that version is installed already.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=self.dir, prefix=".staging-"))
        try:
            tree = staging / "tree"
            if source.is_dir():
                shutil.copytree(source, tree, symlinks=True)
            elif tarfile.is_tarfile(source):
                _unpack(source, tree)
            else:
                raise ReleaseError(f"{source}: neither a release folder nor a .tar.gz")
            info = read_info(tree)
            target = self.path(info.version)
            if target.exists():
                raise ReleaseError(f"release {info.version} is installed already ({target})")
            _fsync_tree(tree)
            tree.rename(target)  # atomic: the release folder is whole or absent
            fsync_path(self.dir)
            return info
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def command(self, version: str, agent_args: list[str]) -> tuple[list[str], list[str]]:
        """The child's argv and the folders to put first on its ``PYTHONPATH``.

        Raises:
            ReleaseError: the release is not installed or its release.json is invalid.
        """
        if version == BASE:
            return [sys.executable, "-P", "-m", "common.cli", *agent_args], []
        folder = self.path(version)
        info = read_info(folder)
        python = str(folder / info.python) if info.python else sys.executable
        return [python, "-P", "-m", info.entry, *agent_args], [str(folder / "lib")]


def _unpack(source: Path, tree: Path) -> None:
    try:
        with tarfile.open(source) as tar:
            tar.extractall(tree, filter="data")  # no absolute paths, links out, devices
    except tarfile.TarError as exc:  # FilterError (a member outside the tree) included
        raise ReleaseError(f"{source}: {exc}") from exc


def _fsync_tree(tree: Path) -> None:
    """Flush every file of a new release before its folder is renamed into place."""
    for path in [*tree.rglob("*"), tree]:
        if path.is_file() and not path.is_symlink() or path.is_dir():
            fsync_path(path)
