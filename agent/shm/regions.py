"""Registered system shared memory regions: checked at registration, leased by requests.

A region is a POSIX shared memory object (a file under ``/dev/shm``) mapped once, at
registration, and viewed by numpy without copies. The checks, each from a Triton advisory:

- the key names a file directly under the root: no separators, no ``..``
  (triton-inference-server/server#8273, #8336);
- the file is a regular file owned by the agent's user or ``allowed_group`` (fstat of the
  opened descriptor, so the file checked is the file mapped);
- ``offset + byte_size`` lies within the file, and a tensor's range within the region
  (#8330, #8335, #7083);
- at most ``max_regions`` and ``max_total_bytes`` registered;
- keys are not echoed into errors of requests (#8269): errors name the region.

Unregistering a region a request holds does not unmap it under that request: the mapping is
closed when its last lease ends, and the request fails with :class:`RegionGoneError` when it
finds, writing its outputs, that its region was taken away.
"""

from __future__ import annotations

import grp
import mmap
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agent.errors import RequestError
from agent.shm.settings import SharedMemorySettings


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


class RegionGoneError(SharedMemoryError):
    """The region was unregistered while a request used it."""

    code = "shared_memory_unregistered"


@dataclass(eq=False)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    _map: mmap.mmap
    _fd: int
    """Kept open to see the object's size at each use (:meth:`check_size`)."""
    leases: int = 0
    registered: bool = True

    def view(self, offset: int, byte_size: int, where: str) -> memoryview:
        """``byte_size`` bytes at ``offset`` in the region, without a copy."""
        if offset < 0 or byte_size < 0 or offset + byte_size > self.byte_size:
            raise SharedMemoryError(
                f"{where}: offset {offset} + byte size {byte_size} is outside region "
                f"{self.name!r} of {self.byte_size} bytes",
                field=where,
            )
        start = self.offset + offset
        return memoryview(self._map)[start : start + byte_size]

    def check_size(self, where: str) -> None:
        """Refuse a region whose object was shrunk since it was registered: reading the
        mapping past the object's end would kill the agent (SIGBUS). A shrink during a request
        is not caught; only the agent's own user (or group) can do it."""
        if os.fstat(self._fd).st_size < self.offset + self.byte_size:
            raise SharedMemoryError(
                f"{where}: the object of region {self.name!r} was shrunk below its registered "
                "size; register it again",
                field=where,
            )

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self._map.close()
        except BufferError:
            # numpy views of it are still alive (a batch the runtime holds): the mapping
            # goes when the last of them does, never under them
            pass

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
        total = sum(r.byte_size for r in self.regions.values())
        if total + byte_size > self.settings.max_total_bytes:
            raise RegionLimitError(
                f"byte_size: {byte_size} bytes more would pass the {self.settings.max_total_bytes}"
                " bytes of all regions (shared_memory.max_total_bytes)",
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
            mapped = mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            raise
        region = Region(name, key, offset, byte_size, mapped, fd)
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
