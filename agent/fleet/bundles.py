"""The bundle inbox: offline bundles (:mod:`common.protocol.bundle`) handed to a running agent.

``edgefleet bundle install FILE`` copies the file into ``<state_dir>/bundles/`` as
``<id>.tar`` (through a rename, so the agent never reads half a file); the fleet client looks
there when it starts and every ``bundle_poll_s``, verifies the bundle's desired state as it
would the retained one from MQTT, moves the files of the verified manifests into the store's
staging directory under the names the downloader looks for (``<sha256>.blob``: so nothing is
downloaded), and queues the manifests for the updater, with the same trial, health window and
rollback. It then writes ``<id>.result.json`` (a :class:`BundleResult` per manifest), which the
command prints, and deletes the bundle.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.fleet.settings import FleetSettings
from common.files import write_atomically
from common.protocol.agent_release import AgentReleaseManifest
from common.protocol.bundle import BundleReader, copy_verified
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.verify import VerifiedManifest

log = logging.getLogger("edgefleet.agent.fleet")
INBOX = "bundles"
RESULT_SUFFIX = ".result.json"
_UNPACKED = ".bundled"
"""Files unpacked, not yet named ``.blob``: the updater's staging sweep leaves them alone."""


@dataclass(frozen=True)
class BundleResult:
    """What became of one manifest of a bundle (or of the whole bundle, ``model`` None)."""

    model: str | None
    version: int | str | None
    """A model's version, or an agent release's (``model`` is ``@agent``)."""
    sequence: int | None
    accepted: bool
    code: str | None = None
    reason: str | None = None


def refused(exc: ProtocolError) -> BundleResult:
    return BundleResult(exc.model, None, exc.sequence, False, exc.code.value, exc.message)


def accepted(vm: VerifiedManifest) -> BundleResult:
    m = vm.manifest
    return BundleResult(m.model, m.version, m.sequence, True)


class BundleInbox:
    def __init__(self, settings: FleetSettings, staging: Path) -> None:
        self.dir = settings.state_dir / INBOX
        self.staging = staging
        self.max_artifact_bytes = settings.max_artifact_bytes

    def sweep(self) -> None:
        """Delete what an unpack cut short (a crash) left in staging; called before any."""
        for pattern in (f"*{_UNPACKED}", f"*{_UNPACKED}-partial"):
            for path in self.staging.glob(pattern):
                path.unlink(missing_ok=True)

    def waiting(self) -> list[Path]:
        """Bundles handed in and not taken yet, oldest name first."""
        if not self.dir.is_dir():
            return []
        return sorted(p for p in self.dir.glob("*.tar") if p.is_file())

    def unpack(self, reader: BundleReader, verified: list[VerifiedManifest]) -> list[str]:
        """Copy the files the verified manifests name from the bundle into staging (as
        ``<sha256>.bundled``, hashed on the way); return their digests. Blocking.

        Raises:
            ProtocolError: a file's bytes do not hash to its name (``digest_mismatch``), or
                exceed ``max_artifact_bytes`` (``oversize``); nothing is left in staging then.
        """
        wanted = {
            ref.sha256
            for vm in verified
            for ref in [*vm.variant.files, *([vm.manifest.golden] if vm.manifest.golden else [])]
        }
        done: list[str] = []
        try:
            for digest, size, stream in reader.artifacts():
                if digest not in wanted:
                    continue  # another profile's variant: not this device's
                if size > self.max_artifact_bytes:
                    raise ProtocolError(
                        Rejection.OVERSIZE,
                        f"bundle file {digest} is {size} bytes, the limit is "
                        f"{self.max_artifact_bytes}",
                    )
                dest = self.staging / f"{digest}{_UNPACKED}"
                copy_verified(stream, dest, digest, size)
                done.append(digest)
        except BaseException:
            self.discard(done)
            raise
        return done

    def unpack_release(
        self, reader: BundleReader, release: AgentReleaseManifest, downloads: Path | None
    ) -> None:
        """Copy a verified agent release's artifact into the launcher's ``downloads`` as a
        finished download (``<sha256>.blob``), hashed on the way. Blocking.

        Raises:
            ProtocolError: as :meth:`unpack`.
        """
        ref = release.artifact
        if downloads is None:  # checked before: no launcher, no release
            return
        downloads.mkdir(parents=True, exist_ok=True)
        for digest, size, stream in reader.artifacts():
            if digest == ref.sha256:
                if size > self.max_artifact_bytes:
                    raise ProtocolError(
                        Rejection.OVERSIZE,
                        f"bundle file {digest} is {size} bytes, the limit is "
                        f"{self.max_artifact_bytes}",
                    )
                copy_verified(stream, downloads / f"{digest}.blob", digest, size)
                return

    def discard(self, digests: list[str]) -> None:
        for digest in digests:
            (self.staging / f"{digest}{_UNPACKED}").unlink(missing_ok=True)

    def place(self, digests: list[str]) -> None:
        """Name the unpacked files as downloaded ones; the caller queues their manifests
        before it next awaits (so no sweep of staging comes between)."""
        for digest in digests:
            (self.staging / f"{digest}{_UNPACKED}").replace(self.staging / f"{digest}.blob")

    def finish(self, bundle: Path, results: list[BundleResult]) -> None:
        """Write what became of ``bundle`` beside it, then delete it."""
        doc = [asdict(r) for r in results]
        try:
            write_atomically(
                bundle.with_name(bundle.stem + RESULT_SUFFIX), json.dumps(doc).encode()
            )
        finally:
            with contextlib.suppress(OSError):
                bundle.unlink()
        log.info("bundle taken", extra={"bundle": bundle.name, "results": doc})
