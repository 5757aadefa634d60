"""An offline wheelhouse for edgefleet's dependencies, packed from the running environment.

The packaging tests install the built wheel into a clean virtual environment, and the .deb
build installs it into one under a staging root. Neither may use the network (tests run
offline), and neither pip's cache nor this machine's local index holds every dependency
(ai-edge-litert comes from PyPI only). So each installed distribution that edgefleet needs
is written back into a wheel from its RECORD (the files pip installed, as the wheel had
them) and its WHEEL tags. pip then installs from this directory with ``--no-index``: a real
resolution and install, of exactly the versions the test environment runs.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SKIPPED_METADATA = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def required_distributions(root: str, extras: tuple[str, ...] = ()) -> list[Distribution]:
    """``root``'s dependencies (with ``extras``), transitively, as installed here; not ``root``."""
    found: dict[str, Distribution] = {}
    pending: list[tuple[str, tuple[str, ...]]] = [(root, extras)]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while pending:
        name, wanted = pending.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        dist = distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            envs = [{"extra": extra} for extra in ("", *wanted)]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
                continue
            key = canonicalize_name(req.name)
            try:
                found.setdefault(key, distribution(req.name))
            except PackageNotFoundError as exc:
                raise RuntimeError(f"{name} needs {req}, which is not installed here") from exc
            pending.append((req.name, tuple(sorted(req.extras))))
    found.pop(canonicalize_name(root), None)
    return sorted(found.values(), key=lambda d: canonicalize_name(d.metadata["Name"]))


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def repack(dist: Distribution, directory: Path) -> Path:
    """Write ``dist`` back into a wheel in ``directory``; scripts outside site-packages
    are left out (pip writes console scripts again from entry_points.txt)."""
    files = [f for f in dist.files or [] if ".." not in f.parts and "__pycache__" not in f.parts]
    info_dir = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    wheel_file = dist.read_text("WHEEL") or ""
    tags = [
        line.split(":", 1)[1].strip().split("-")
        for line in wheel_file.splitlines()
        if line.startswith("Tag:")
    ]
    # the compressed tag set of the file name, e.g. py2.py3-none-any
    tag = "-".join(".".join(sorted({t[i] for t in tags})) for i in range(3))
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    target = directory / f"{name}-{dist.version}-{tag}.whl"
    record: list[str] = []
    # ZIP_STORED: the wheelhouse is read once, by pip, a moment later
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as whl:
        for f in files:
            if f.parts[0] == info_dir and f.name in SKIPPED_METADATA:
                continue
            path = Path(str(f.locate()))
            data = path.read_bytes()
            info = zipfile.ZipInfo(f.as_posix())
            info.external_attr = (path.stat().st_mode & 0o777) << 16  # keep executable bits
            whl.writestr(info, data)
            record.append(f"{f.as_posix()},{_record_hash(data)},{len(data)}")
        record.append(f"{info_dir}/RECORD,,")
        whl.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return target


def build_wheelhouse(
    directory: Path, root: str = "edgefleet", extras: tuple[str, ...] = ()
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for dist in required_distributions(root, extras):
        repack(dist, directory)
    return directory
