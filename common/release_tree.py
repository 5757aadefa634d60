"""An agent release tree as a ``.tar.gz``, for both sides: packed here (by tests, the docs and
operators), read back by the control plane when it is pushed, and unpacked by the launcher
(agent/launcher/releases.py has the tree's format: ``release.json`` and ``lib/``).

The control plane only looks at ``release.json`` (the version it names, its entry module); the
launcher checks the whole tree again when it installs it.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path

from common.protocol.agent_release import AGENT_VERSION_PATTERN

RELEASE_FILE = "release.json"
MAX_RELEASE_FILE_BYTES = 64 * 1024
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
GOOD_ENTRY = "from common.cli import main\n\nmain()\n"
"""An entry module that runs the agent installed beside the launcher (a release of the code
on the path): what a release built for a test or a demo runs."""


class ReleaseTreeError(ValueError):
    """Not a release tree; the message says what is missing or wrong."""


def pack(
    out: Path,
    version: str,
    *,
    entry_source: str = GOOD_ENTRY,
    lib: Path | None = None,
    entry: str = "common.cli",
) -> Path:
    """Write a release tree of ``version`` as ``out`` (a ``.tar.gz``): its ``release.json``
    and ``lib/``, either a copy of ``lib`` (whose module ``entry`` is run) or one module
    ``edgefleet_release.py`` holding ``entry_source`` (the entry then). Returns ``out``."""
    if not re.fullmatch(AGENT_VERSION_PATTERN, version):
        raise ReleaseTreeError(f"version {version!r} does not match {AGENT_VERSION_PATTERN}")
    info = {"version": version, "entry": "edgefleet_release" if lib is None else entry}
    staging = out.with_name(out.name + ".tree")
    (staging / "lib").mkdir(parents=True, exist_ok=True)
    (staging / RELEASE_FILE).write_text(json.dumps(info))
    if lib is None:
        (staging / "lib" / "edgefleet_release.py").write_text(entry_source)
    with tarfile.open(out, "w:gz") as tar:
        tar.add(staging / RELEASE_FILE, arcname=RELEASE_FILE)
        tar.add(lib if lib is not None else staging / "lib", arcname="lib")
    shutil.rmtree(staging)
    return out


def read_version(tarball: Path) -> str:
    """The version the tarball's ``release.json`` names (blocking: it reads the archive).

    Raises:
        ReleaseTreeError: not a ``.tar.gz``, no ``release.json`` at its top, or one without a
            valid version or entry module.
    """
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            member = _release_member(tar)
            if member.size > MAX_RELEASE_FILE_BYTES:
                raise ReleaseTreeError(f"{RELEASE_FILE} is over {MAX_RELEASE_FILE_BYTES} bytes")
            fh = tar.extractfile(member)
            if fh is None:
                raise ReleaseTreeError(f"{RELEASE_FILE} is not a file")
            raw = fh.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ReleaseTreeError(f"not a .tar.gz of a release tree ({exc})") from None
    try:
        info = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ReleaseTreeError(f"{RELEASE_FILE} is not JSON ({exc})") from None
    if not isinstance(info, dict):
        raise ReleaseTreeError(f"{RELEASE_FILE} is not a JSON object")
    version = info.get("version")
    if not isinstance(version, str) or not re.fullmatch(AGENT_VERSION_PATTERN, version):
        raise ReleaseTreeError(f"{RELEASE_FILE}: version {version!r} is not a release version")
    entry = info.get("entry", "common.cli")
    if not isinstance(entry, str) or not _MODULE.fullmatch(entry):
        raise ReleaseTreeError(f"{RELEASE_FILE}: entry {entry!r} is not a module name")
    return version


def _release_member(tar: tarfile.TarFile) -> tarfile.TarInfo:
    for name in (RELEASE_FILE, f"./{RELEASE_FILE}"):
        try:
            return tar.getmember(name)
        except KeyError:
            continue
    raise ReleaseTreeError(f"no {RELEASE_FILE} at the top of the archive")
