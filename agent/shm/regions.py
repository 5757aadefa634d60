"""Registered system shared memory regions: checked at registration, leased by requests.

A region is a POSIX shared memory object (a file under ``/dev/shm``) kept open from
registration. Its bytes are read and written with ``pread``/``pwrite`` on that descriptor, never
through a mapping: the object's owner (or a member of ``allowed_group``) may truncate it at any
moment, and a mapped page past the new end would kill the agent with SIGBUS; a system call on a
shrunk object returns short instead, and the request is refused (:class:`RegionShrunkError`).
The price is one copy of each input out of the region (see docs/local-apps.md for its cost).
The checks, each from a Triton advisory:

- the key names a file directly under the root: no separators, no ``..``
  (triton-inference-server/server#8273, #8336);
- the file is a regular file owned by the agent's user or ``allowed_group`` (fstat of the
  opened descriptor, so the file checked is the file read);
- ``offset + byte_size`` lies within the file, and a tensor's range within the region
  (#8330, #8335, #7083);
- at most ``max_regions``, and ``max_total_bytes`` of the objects' reach (``offset +
  byte_size`` each: what a region may make the agent read);
- keys are not echoed into errors of requests (#8269): errors name the region.

Unregistering a region a request holds does not close it under that request: the descriptor
is closed when its last lease ends, and the request fails with :class:`RegionGoneError` when it
finds, writing its outputs, that its region was taken away.
"""

from __future__ import annotations

import grp
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agent.errors import RequestError
from agent.shm.settings import SharedMemorySettings

CUDA_UNSUPPORTED = (
    "CUDA shared memory is not supported by this agent; register a system shared memory "
    "region instead"
)
"""Why a CUDA region is refused, on REST and gRPC alike."""


class SharedMemoryError(RequestError):
    """A registration or a tensor's use of a region is refused; ``field`` names the part."""

    code = "shared_memory_invalid"


class RegionNotFoundError(SharedMemoryError):
    code = "shared_memory_not_found"


class RegionLimitError(SharedMemoryError):
    """Over ``max_regions`` or ``max_total_bytes``."""

    code = "shared_memory_limit"


class RegionPermissionError(SharedMemoryError):
    """The object belongs to another user (and not to ``allowed_group``)."""

    code = "shared_memory_permission"


class RegionShrunkError(SharedMemoryError):
    """The region's object is smaller than the range a request reads or writes: its owner
    truncated it after registering it."""

    code = "shared_memory_shrunk"


class RegionGoneError(SharedMemoryError):
    """The region was unregistered while a request used it."""

    code = "shared_memory_unregistered"


@dataclass(eq=False)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    _fd: int
    """The object, open for ``pread``/``pwrite``."""
    leases: int = 0
    registered: bool = True

    def place(self, offset: int, byte_size: int, where: str) -> int:
        """The object's offset of ``byte_size`` bytes at ``offset`` in the region."""
        if offset < 0 or byte_size < 0 or offset + byte_size > self.byte_size:
            raise SharedMemoryError(
                f"{where}: offset {offset} + byte size {byte_size} is outside region "
                f"{self.name!r} of {self.byte_size} bytes",
                field=where,
            )
        return self.offset + offset

    def _shrunk(self, where: str) -> RegionShrunkError:
        return RegionShrunkError(
            f"{where}: the object of region {self.name!r} was shrunk below the range read or "
            "written; register it again",
            field=where,
        )

    def read(self, offset: int, byte_size: int, where: str) -> memoryview:
        """A copy of ``byte_size`` bytes at ``offset`` in the region.

        Raises:
            RegionShrunkError: the object ends before the range does.
        """
        start = self.place(offset, byte_size, where)
        buffer = np.empty(byte_size, np.uint8).data  # not zeroed: every byte is read into
        done = 0
        while done < byte_size:
            got = os.preadv(self._fd, [buffer[done:]], start + done)
            if got == 0:
                raise self._shrunk(where)
            done += got
        return buffer

    def write(self, offset: int, data: memoryview, where: str) -> None:
        """Write ``data`` at ``offset`` in the region. An object shrunk meanwhile is refused,
        not grown back: the agent writes only within what its owner keeps.

        Raises:
            RegionShrunkError: the object ends before the range does.
        """
        start = self.place(offset, data.nbytes, where)
        if os.fstat(self._fd).st_size < start + data.nbytes:
            raise self._shrunk(where)
        data = data.cast("B")
        done = 0
        while done < len(data):
            done += os.pwrite(self._fd, data[done:], start + done)

    def check_size(self, where: str) -> None:
        """Refuse a region whose object was shrunk below its registered size since then (a
        shrink later, during the request, is caught by :meth:`read` and :meth:`write`)."""
        if os.fstat(self._fd).st_size < self.offset + self.byte_size:
            raise self._shrunk(where)

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def status(self) -> dict[str, object]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


@dataclass
class Lease:
    """The regions one request uses; :meth:`release` once it is answered."""

    registry: SharedMemoryRegistry
    regions: list[Region] = field(default_factory=list)

    def take(self, name: str, where: str) -> Region:
        region = self.registry.get(name, where)
        if region not in self.regions:
            region.check_size(where)
            region.leases += 1
            self.regions.append(region)
        return region

    def check(self) -> None:
        """Raise :class:`RegionGoneError` if a region of this request was unregistered."""
        for region in self.regions:
            if not region.registered:
                raise RegionGoneError(
                    f"shared memory region {region.name!r} was unregistered while the "
                    "request used it",
                    field="parameters.shared_memory_region",
                )

    def release(self) -> None:
        for region in self.regions:
            region.leases -= 1
            if not region.registered and region.leases == 0:
                region._close()
        self.regions.clear()


class SharedMemoryRegistry:
    """The registered regions, by name; one per agent, shared by HTTP and gRPC."""

    def __init__(self, settings: SharedMemorySettings) -> None:
        self.settings = settings
        self.regions: dict[str, Region] = {}
        self._group = _group_id(settings.allowed_group)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        """Map ``byte_size`` bytes at ``offset`` of the object ``key`` as region ``name``."""
        if not self.settings.enabled:
            raise SharedMemoryError(
                "shared memory is off (shared_memory.enabled)", field="shared_memory"
            )
        if not name:
            raise SharedMemoryError("name: must not be empty", field="name")
        if name in self.regions:
            raise SharedMemoryError(
                f"name: region {name!r} is already registered; unregister it first",
                field="name",
            )
        if offset < 0 or byte_size <= 0:
            raise SharedMemoryError("offset must be >= 0 and byte_size > 0", field="byte_size")
        if len(self.regions) >= self.settings.max_regions:
            raise RegionLimitError(
                f"{len(self.regions)} regions are registered, the most allowed "
                "(shared_memory.max_regions)",
                field="name",
            )
        total = sum(r.offset + r.byte_size for r in self.regions.values())
        if total + offset + byte_size > self.settings.max_total_bytes:
            raise RegionLimitError(
                f"byte_size: offset {offset} + byte_size {byte_size} more would pass the "
                f"{self.settings.max_total_bytes} bytes that all regions may reach "
                "(shared_memory.max_total_bytes)",
                field="byte_size",
            )
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise SharedMemoryError(
                f"key: cannot open shared memory object {key!r} ({exc.strerror})", field="key"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SharedMemoryError(f"key: {key!r} is not a shared memory object", field="key")
            if info.st_uid != os.getuid() and (self._group is None or info.st_gid != self._group):
                raise RegionPermissionError(
                    f"key: {key!r} belongs to another user; only the agent's user"
                    + ("" if self._group is None else f" or group {self.settings.allowed_group}")
                    + " may register",
                    field="key",
                )
            if offset + byte_size > info.st_size:
                raise SharedMemoryError(
                    f"offset {offset} + byte_size {byte_size} is past the end of {key!r} "
                    f"({info.st_size} bytes)",
                    field="byte_size",
                )
        except BaseException:
            os.close(fd)
            raise
        region = Region(name, key, offset, byte_size, fd)
        self.regions[name] = region
        return region

    def unregister(self, name: str | None) -> None:
        """Unregister ``name`` (None: every region); an unknown name is not an error, as in
        Triton. A region in use is closed when its last request lets it go."""
        names = list(self.regions) if name is None else [name]
        for n in names:
            region = self.regions.pop(n, None)
            if region is None:
                continue
            region.registered = False
            if region.leases == 0:
                region._close()

    def status(self, name: str | None) -> list[dict[str, object]]:
        """Triton's status rows: every region, or the one named."""
        return [r.status() for r in self.regions_named(name)]

    def regions_named(self, name: str | None) -> list[Region]:
        if name is None:
            return list(self.regions.values())
        return [self.get(name, "name")]

    def get(self, name: str, where: str) -> Region:
        region = self.regions.get(name)
        if region is None:
            raise RegionNotFoundError(
                f"{where}: no shared memory region {name!r} is registered", field=where
            )
        return region

    def lease(self) -> Lease:
        return Lease(self)

    def close(self) -> None:
        self.unregister(None)

    def _path(self, key: str) -> Path:
        name = key[1:] if key.startswith("/") else key
        if not name or "/" in name or "\0" in name or name in (".", ".."):
            raise SharedMemoryError(
                f"key: {key!r} is not a POSIX shared memory name ('/name', no other '/')",
                field="key",
            )
        return Path(self.settings.root) / name


def _group_id(group: str | None) -> int | None:
    if group is None:
        return None
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"shared_memory.allowed_group: no group {group!r}") from None


def as_array(view: memoryview, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    """A numpy array over ``view`` (no copy)."""
    return np.frombuffer(view, dtype=dtype).reshape(shape)
