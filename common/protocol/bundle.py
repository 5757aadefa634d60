"""An offline bundle: what a device without a broker installs from a file
(``edgefleet bundle create`` writes it, ``edgefleet bundle install`` hands it to the agent).

A bundle is an uncompressed tar of:

- ``desired.json``: a :class:`~common.protocol.messages.DesiredState` for one device, the same
  message the control plane retains on the device's desired topic; its manifests are signed
  envelopes, verified by the device exactly as when they arrive over MQTT.
- ``artifacts/<sha256>``: each file the manifests name, by digest. Nothing in the tar is
  trusted: a file is used only where its bytes hash to a digest a verified manifest names.

The producer and the consumer share this module, so the layout has one definition.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import DesiredState

DESIRED = "desired.json"
ARTIFACTS = "artifacts/"
_DIGEST = re.compile(r"[0-9a-f]{64}")


def write_bundle(out: IO[bytes], desired: DesiredState, files: dict[str, Path]) -> None:
    """Write a bundle of ``desired`` and ``files`` (digest -> the file's path) to ``out``."""
    with tarfile.open(fileobj=out, mode="w|") as tar:
        body = desired.model_dump_json().encode()
        info = tarfile.TarInfo(DESIRED)
        info.size = len(body)
        tar.addfile(info, _Bytes(body))
        for digest, path in sorted(files.items()):
            tar.add(str(path), arcname=f"{ARTIFACTS}{digest}", recursive=False)


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._at + n
        chunk, self._at = self._data[self._at : end], min(end, len(self._data))
        return chunk


class BundleReader:
    """A bundle opened for reading; members are checked as they are read.

    Raises:
        ProtocolError: ``malformed`` (not a bundle, or a member where none belongs),
            ``oversize`` (a member over the limit given).
    """

    def __init__(self, path: Path, *, max_desired_bytes: int) -> None:
        try:
            self._tar = tarfile.open(path, mode="r:")
        except (tarfile.TarError, OSError) as exc:
            raise ProtocolError(Rejection.MALFORMED, f"not a bundle: {exc}") from None
        self.max_desired_bytes = max_desired_bytes

    def close(self) -> None:
        self._tar.close()

    def desired(self) -> bytes:
        try:
            member = self._tar.getmember(DESIRED)
        except KeyError:
            raise ProtocolError(Rejection.MALFORMED, f"the bundle holds no {DESIRED}") from None
        if member.size > self.max_desired_bytes:
            raise ProtocolError(
                Rejection.OVERSIZE,
                f"{DESIRED} is {member.size} bytes, the limit is {self.max_desired_bytes}",
            )
        fh = self._tar.extractfile(member)
        if fh is None:
            raise ProtocolError(Rejection.MALFORMED, f"{DESIRED} is not a file")
        return fh.read()

    def artifacts(self) -> Iterator[tuple[str, int, IO[bytes]]]:
        """(digest, size, stream) of each artifact file; a stream is read before the next."""
        for member in self._tar.getmembers():
            if member.name == DESIRED:
                continue
            digest = member.name.removeprefix(ARTIFACTS)
            if not member.isfile() or digest == member.name or not _DIGEST.fullmatch(digest):
                raise ProtocolError(Rejection.MALFORMED, f"unexpected member {member.name!r}")
            fh = self._tar.extractfile(member)
            assert fh is not None  # a regular file
            yield digest, member.size, fh


def copy_verified(src: IO[bytes], dest: Path, digest: str, size: int) -> None:
    """Copy ``src`` to ``dest`` (through ``<dest>-partial``) if its bytes hash to ``digest``.

    Raises:
        ProtocolError: ``digest_mismatch`` (``dest`` is not written).
    """
    part = dest.with_name(dest.name + "-partial")  # not a .part the updater sweeps
    sha = hashlib.sha256()
    with part.open("wb") as out:
        while block := src.read(1 << 20):
            sha.update(block)
            out.write(block)
    if sha.hexdigest() != digest:
        part.unlink()
        raise ProtocolError(
            Rejection.DIGEST_MISMATCH,
            f"bundle file artifacts/{digest} ({size} bytes) hashes to {sha.hexdigest()}",
        )
    part.replace(dest)
