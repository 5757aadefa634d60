"""The model store on disk: the agent's model repository, updated so that a crash at any
point leaves the last committed version in place and served after a restart.

- Files are downloaded into ``<repo>/.staging/`` and verified there.
- A verified version is assembled in a scratch directory and renamed into
  ``<repo>/<model>/<version>`` in one step. It is not served yet.
- The commit is one atomic rewrite of ``<repo>/<model>/config.toml``, whose version policy
  names exactly the committed version. Until then a restart serves the previous one.
- A version installed uncommitted carries a ``.uncommitted`` marker, removed at its commit.
  A marked version of a model that has no pinning ``config.toml`` yet (a model new to the
  device) would be served by a restart with default config: :meth:`ModelStore.recover`
  removes it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w

from common.files import write_atomically
from common.model_config import CONFIG_FILE
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import FileRef

DIGESTS_FILE = ".digests.json"
UNCOMMITTED = ".uncommitted"


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


class ModelStore:
    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self.staging = repository / ".staging"

    def recover(self, committed: dict[str, int]) -> None:
        """After a crash, before the repository is loaded: drop half-assembled versions and
        uncommitted versions a restart would serve, and reconcile the pointers with
        ``committed`` (the versions ``fleet-state.json`` says were committed, by model).

        Partial downloads are kept to resume; the updater sweeps the ones no longer wanted
        once it knows the desired state (:meth:`sweep_staging`).
        """
        self.staging.mkdir(parents=True, exist_ok=True)
        for entry in self.staging.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
        for model, version in committed.items():
            self._reconcile(model, version)
        for marker in self.repository.glob(f"*/*/{UNCOMMITTED}"):
            version_dir = marker.parent
            if not version_dir.name.isdigit():
                continue
            pinned = self._pinned(version_dir.parent.name)
            if pinned is None:
                shutil.rmtree(version_dir, ignore_errors=True)  # would be served: never committed
                # a model new to the device is gone with it, rather than loaded with no version
                with contextlib.suppress(OSError):
                    version_dir.parent.rmdir()
            elif int(version_dir.name) in pinned:
                marker.unlink()  # committed: the crash came before its marker went

    def _pinned(self, model: str) -> list[int] | None:
        path = self.repository / model / CONFIG_FILE
        doc: dict[str, Any] = tomllib.loads(path.read_text()) if path.is_file() else {}
        specific = doc.get("version_policy", {}).get("specific")
        return list(specific) if specific else None

    def _reconcile(self, model: str, version: int) -> None:
        """A crash between the pointer's rewrite and the state's (or a disk that refused the
        state and then the pointer's undo) leaves ``config.toml`` naming a version the state
        does not record as committed. The state is what the anti-rollback floor and the
        fleet's view rest on, so it wins: the pointer goes back to its committed version
        (serving parameters stay as written), and the retained desired state brings the
        newer version back through its health window and commit."""
        pinned = self._pinned(model)
        if pinned in (None, [version]) or not self.version_dir(model, version).is_dir():
            return  # nothing to reconcile, or nothing to go back to: serve what is pinned
        path = self.repository / model / CONFIG_FILE
        doc = tomllib.loads(path.read_text())
        doc["version_policy"] = {"specific": [version]}
        write_atomically(path, tomli_w.dumps(doc).encode())

    def sweep_staging(self, keep: set[str]) -> None:
        """Delete downloaded and partial files whose sha256 is not in ``keep``."""
        for entry in self.staging.iterdir():
            if entry.suffix in (".blob", ".part") and entry.stem not in keep:
                entry.unlink(missing_ok=True)

    def version_dir(self, model: str, version: int) -> Path:
        return self.repository / model / str(version)

    def installed(self, model: str, version: int, files: list[FileRef]) -> bool:
        """The version is on disk with exactly these files, intact (a retry after a crash, or
        a roll-forward to a version kept on disk). A version whose files no longer match their
        digests (bit rot, a torn write) is removed, to be downloaded again. Blocking: hashes.

        Raises:
            ProtocolError: the version exists with different files; versions are immutable.
        """
        target = self.version_dir(model, version)
        if not target.exists():
            return False
        digests_file = target / DIGESTS_FILE
        recorded = json.loads(digests_file.read_text()) if digests_file.is_file() else None
        wanted = {f.name: f.sha256 for f in files}
        if recorded != wanted:
            raise ProtocolError(
                Rejection.MALFORMED,
                f"version {version} of {model} is already on disk with other files; "
                "versions are immutable, publish a new version number",
            )
        if not all(_intact(target / f.name, f) for f in files):
            shutil.rmtree(target, ignore_errors=True)
            return False
        return True

    def install(
        self, model: str, version: int, files: dict[str, Path], refs: list[FileRef]
    ) -> Path:
        """Move verified files into ``<repo>/<model>/<version>`` atomically."""
        target = self.version_dir(model, version)
        scratch: Path | None = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(dir=self.staging, prefix=f"{model}-{version}-"))
            for name, path in files.items():
                _link_or_copy(path, scratch / name)
            (scratch / DIGESTS_FILE).write_text(
                json.dumps({r.name: r.sha256 for r in refs}, sort_keys=True)
            )
            (scratch / UNCOMMITTED).touch()
            for p in scratch.iterdir():
                with p.open("rb") as fh:
                    os.fsync(fh.fileno())
            os.rename(scratch, target)
        except BaseException as exc:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            if isinstance(exc, OSError) and is_disk_full(exc):
                raise ProtocolError(
                    Rejection.DISK_FULL, f"no space left installing version {version} of {model}"
                ) from exc
            raise
        return target

    def pin(self, model: str, versions: list[int]) -> None:
        """Before a new version directory appears next to a model that is not yet pinned,
        pin what it serves now: a "latest" policy would otherwise pick up the uncommitted
        version on the next restart."""
        path = self.repository / model / CONFIG_FILE
        doc: dict[str, Any] = tomllib.loads(path.read_text()) if path.is_file() else {}
        policy = doc.get("version_policy", {})
        if "specific" in policy or not versions:
            return
        doc["version_policy"] = {"specific": sorted(versions)}
        write_atomically(path, tomli_w.dumps(doc).encode())

    def commit(self, model: str, version: int, config: dict[str, Any]) -> Callable[[], None]:
        """Point the model at ``version``: the one step that changes what a restart serves.
        Returns what puts the previous pointer back, for a commit whose state write fails."""
        path = self.repository / model / CONFIG_FILE
        before = path.read_bytes() if path.is_file() else None
        doc = {k: v for k, v in config.items() if k != "version_policy"}
        doc["version_policy"] = {"specific": [version]}
        write_atomically(path, tomli_w.dumps(doc).encode())
        (self.version_dir(model, version) / UNCOMMITTED).unlink(missing_ok=True)

        def undo() -> None:
            if before is None:
                path.unlink(missing_ok=True)
            else:
                write_atomically(path, before)
            (self.version_dir(model, version) / UNCOMMITTED).touch()

        return undo

    def prune(self, model: str, keep: set[int]) -> None:
        """Remove version directories of ``model`` not in ``keep``."""
        model_dir = self.repository / model
        if not model_dir.is_dir():
            return
        for path in model_dir.iterdir():
            if (
                path.is_dir()
                and path.name.isascii()
                and path.name.isdigit()
                and int(path.name) not in keep
            ):
                shutil.rmtree(path, ignore_errors=True)

    def remove_version(self, model: str, version: int) -> None:
        shutil.rmtree(self.version_dir(model, version), ignore_errors=True)


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link: the verified download becomes the installed file without a second copy
    on a small disk. A copy where links are not possible (another filesystem)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _intact(path: Path, ref: FileRef) -> bool:
    if not path.is_file() or path.stat().st_size != ref.size:
        return False
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest() == ref.sha256
