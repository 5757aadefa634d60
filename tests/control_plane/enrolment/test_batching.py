"""Group commit of broker accounts: devices enrolling while a batch is applied share the next
one, a device's own failure stays its own, and a batch's failure reaches each of its callers."""

from __future__ import annotations

import asyncio

import pytest

from control_plane.enrolment.batching import GroupCommit


class Recorder:
    """An apply step that holds its first batch until released, and fails ``bad`` alone."""

    def __init__(self, bad: str = "") -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()
        self.bad = bad

    async def __call__(self, ids: list[str]) -> dict[str, str | Exception]:
        self.batches.append(ids)
        if len(self.batches) == 1:
            await self.release.wait()
        return {i: ValueError(i) if i == self.bad else f"pw-{i}" for i in ids}


def test_devices_arriving_during_a_batch_share_the_next() -> None:
    async def scenario() -> None:
        apply = Recorder(bad="d5")
        commit: GroupCommit[str] = GroupCommit(apply, max_batch=100)
        first = asyncio.create_task(commit.submit("d0"))
        await asyncio.sleep(0)  # d0's batch is being applied
        rest = [asyncio.create_task(commit.submit(f"d{i}")) for i in range(1, 10)]
        await asyncio.sleep(0)
        apply.release.set()
        assert await first == "pw-d0"
        results = await asyncio.gather(*rest, return_exceptions=True)
        assert apply.batches == [["d0"], [f"d{i}" for i in range(1, 10)]]
        assert commit.batches == 2
        assert isinstance(results[4], ValueError)  # d5 alone failed
        assert [r for r in results if isinstance(r, str)] == [
            f"pw-d{i}" for i in range(1, 10) if i != 5
        ]

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_batch_is_at_most_max_batch_and_a_failed_batch_fails_each_caller() -> None:
    async def scenario() -> None:
        calls: list[list[str]] = []

        async def broken(ids: list[str]) -> dict[str, str | Exception]:
            calls.append(ids)
            raise OSError("broker away")

        commit: GroupCommit[str] = GroupCommit(broken, max_batch=3)
        results = await asyncio.gather(
            *(commit.submit(f"d{i}") for i in range(7)), return_exceptions=True
        )
        assert all(isinstance(r, OSError) for r in results)
        assert all(1 <= len(c) <= 3 for c in calls)
        assert sorted(i for c in calls for i in c) == [f"d{i}" for i in range(7)]

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_cancelled_caller_leaves_the_others_their_answer() -> None:
    async def scenario() -> None:
        apply = Recorder()
        commit: GroupCommit[str] = GroupCommit(apply, max_batch=100)
        flusher = asyncio.create_task(commit.submit("d0"))
        await asyncio.sleep(0)
        waiter = asyncio.create_task(commit.submit("d1"))
        await asyncio.sleep(0)
        flusher.cancel()  # cancelled while applying d0's batch
        with pytest.raises(asyncio.CancelledError):
            await flusher
        apply.release.set()
        assert await waiter == "pw-d1"

    asyncio.run(asyncio.wait_for(scenario(), 10))
