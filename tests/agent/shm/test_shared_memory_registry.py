"""The shared memory registry's checks, on real POSIX shared memory objects in /dev/shm."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest

from agent.shm.regions import (
    RegionGoneError,
    RegionLimitError,
    RegionNotFoundError,
    RegionPermissionError,
    RegionShrunkError,
    SharedMemoryError,
    SharedMemoryRegistry,
)
from agent.shm.settings import SharedMemorySettings

NOBODY = 65534


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    made = shared_memory.SharedMemory(f"edgefleet-t-{uuid.uuid4().hex[:10]}", True, 4096)
    yield made
    made.close()
    made.unlink()


def registry(**settings: object) -> SharedMemoryRegistry:
    return SharedMemoryRegistry(SharedMemorySettings(**settings))  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["/a/b", "../shm/x", "/..", "", "/", "a\0b", "/dev/shm/x"])
def test_keys_are_confined_to_the_root(key: str) -> None:
    with pytest.raises(SharedMemoryError, match="not a POSIX shared memory name"):
        registry().register("r", key, 0, 8)


def test_a_missing_object_is_refused() -> None:
    with pytest.raises(SharedMemoryError, match="cannot open"):
        registry().register("r", f"/edgefleet-none-{uuid.uuid4().hex}", 0, 8)


def test_ranges_stay_within_the_object(segment: shared_memory.SharedMemory) -> None:
    shm = registry()
    with pytest.raises(SharedMemoryError, match="past the end"):
        shm.register("r", segment.name, 4000, 200)
    region = shm.register("r", "/" + segment.name, 96, 4000)
    with pytest.raises(SharedMemoryError, match="outside region"):
        region.read(3999, 2, "t")
    segment.buf[96:100] = b"abcd"
    assert bytes(region.read(0, 4, "t")) == b"abcd"  # offsets count from the region's start


def test_registrations_are_limited(segment: shared_memory.SharedMemory) -> None:
    shm = registry(max_regions=2, max_total_bytes=3000)
    shm.register("a", segment.name, 0, 1000)
    with pytest.raises(RegionLimitError, match="max_total_bytes"):
        shm.register("b", segment.name, 0, 2001)
    # a region's reach is offset + byte_size: 16 bytes far into an object count as far
    with pytest.raises(RegionLimitError, match="max_total_bytes"):
        shm.register("b", segment.name, 1990, 16)
    shm.register("b", segment.name, 0, 2000)
    with pytest.raises(RegionLimitError, match="max_regions"):
        shm.register("c", segment.name, 0, 1)
    shm.unregister("a")
    shm.register("c", segment.name, 0, 1)
    assert [r["name"] for r in shm.status(None)] == ["b", "c"]


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_only_the_agents_user_or_group_may_register(segment: shared_memory.SharedMemory) -> None:
    path = f"/dev/shm/{segment.name}"
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(RegionPermissionError, match="belongs to another user"):
        registry().register("r", segment.name, 0, 8)
    assert registry(allowed_group=str(NOBODY)).register("r", segment.name, 0, 8).byte_size == 8


def test_unregistering_a_leased_region_defers_the_close(
    segment: shared_memory.SharedMemory,
) -> None:
    shm = registry()
    shm.register("r", segment.name, 0, 4096)
    lease = shm.lease()
    region = lease.take("r", "t")
    segment.buf[0] = 7
    shm.unregister("r")
    assert region.read(0, 1, "t")[0] == 7  # still open under the request that holds it
    with pytest.raises(RegionGoneError, match="unregistered while the request used it"):
        lease.check()
    lease.release()
    with pytest.raises(RegionNotFoundError):
        shm.lease().take("r", "t")


def test_off_refuses_registration(segment: shared_memory.SharedMemory) -> None:
    with pytest.raises(SharedMemoryError, match="shared_memory.enabled"):
        registry(enabled=False).register("r", segment.name, 0, 8)


def test_a_shrunk_object_is_refused_at_the_lease(segment: shared_memory.SharedMemory) -> None:
    shm = registry()
    shm.register("r", segment.name, 0, 4096)
    os.truncate(f"/dev/shm/{segment.name}", 1024)  # reading past its end would be SIGBUS
    with pytest.raises(SharedMemoryError, match="was shrunk"):
        shm.lease().take("r", "t")
    os.truncate(f"/dev/shm/{segment.name}", 4096)
    assert shm.lease().take("r", "t").byte_size == 4096


def test_a_shrink_during_a_request_is_refused(segment: shared_memory.SharedMemory) -> None:
    """Its owner truncates the object after registering it: reads and writes past the new end
    are refused with the reason (through a mapping they would kill the agent with SIGBUS), and
    nothing is written beyond what the owner keeps."""
    region = registry().register("r", segment.name, 0, 4096)
    os.truncate(f"/dev/shm/{segment.name}", 100)
    assert bytes(region.read(0, 4, "t")) == bytes(segment.buf[:4])  # what is left still reads
    with pytest.raises(RegionShrunkError, match="was shrunk"):
        region.read(64, 64, "inputs[0]")
    with pytest.raises(RegionShrunkError, match="was shrunk"):
        region.write(64, memoryview(b"x" * 64), "outputs[0]")
    assert os.stat(f"/dev/shm/{segment.name}").st_size == 100  # not grown back
    with pytest.raises(RegionShrunkError):
        region.check_size("t")  # what a new request's lease checks first
