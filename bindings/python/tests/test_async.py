"""The asyncio face: acquires in worker threads, ended by cancelling the task."""

import asyncio
import time

import pytest

from redlease import AsyncLock, LockBusyError, LockNotHeldError, _registry


async def until(cond, limit=5.0):
    deadline = time.monotonic() + limit
    while not cond() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return cond()


def test_acquire_async_takes_a_free_lock_and_releases_it(client, r):
    async def main():
        lk = await client.acquire_async("async-free", ttl=10.0, wait=1.0)
        assert isinstance(lk, AsyncLock)
        assert lk.held and r.get("async-free") == lk.token
        assert lk.fencing_token > 0 and 5.0 < lk.remaining <= 10.0
        await lk.extend(20.0)
        assert r.pttl("async-free") > 15_000
        assert await lk.release() is True
        assert not lk.held

    asyncio.run(main())
    assert r.exists("async-free") == 0


def test_async_with_releases_on_exit_and_lets_exceptions_through(client, r):
    async def main():
        async with client.lock_async("async-with", ttl=10.0, wait=1.0) as lk:
            assert r.get("async-with") == lk.token
        assert r.exists("async-with") == 0
        with pytest.raises(KeyError):
            async with client.lock_async("async-with", wait=1.0):
                raise KeyError("the block's own")
        assert r.exists("async-with") == 0
        with pytest.raises(LockNotHeldError):
            async with client.lock_async("async-with", ttl=0.3, wait=1.0) as lk:
                r.delete("async-with")
                assert await until(lk.lost.is_set)

    asyncio.run(main())
    assert not _registry._LIVE


def test_async_busy(client):
    holder = client.acquire("async-busy", wait=0)

    async def main():
        with pytest.raises(LockBusyError):
            await client.acquire_async("async-busy", wait=0)
        started = time.monotonic()
        with pytest.raises(LockBusyError):
            await client.acquire_async("async-busy", wait=0.3)
        assert time.monotonic() - started >= 0.3

    asyncio.run(main())
    assert holder.release() is True


def test_cancelling_a_task_blocked_on_a_held_lock_ends_it_promptly_holding_nothing(client, r):
    holder = client.acquire("async-cancel", ttl=10.0, wait=0)
    live_before = set(_registry._LIVE)

    async def main():
        lk = client.lock_async("async-cancel", wait=None)
        task = asyncio.create_task(lk.acquire())
        assert await until(lambda: r.zcard("redlease:queue:{async-cancel}") == 1)
        # The loop is free while the acquire blocks.
        ticks = 0
        for _ in range(10):
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 10 and not task.done()
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        took = time.monotonic() - cancelled_at
        # At once, with room for a loaded host; well short of the 2 s I/O timeout a
        # withdrawal that did not hurry would wait.
        assert took < 1.5, f"the cancellation took {took:.3f} s"
        return lk

    lk = asyncio.run(main())
    assert not lk.held
    assert set(_registry._LIVE) == live_before
    assert r.zcard("redlease:queue:{async-cancel}") == 0
    assert holder.release() is True
    assert r.exists("async-cancel") == 0, "the release was handed to the cancelled task"


def test_a_cancellation_racing_a_grant_leaves_nothing_held(client, r):
    async def main():
        outcomes = set()
        for i in range(20):
            task = asyncio.create_task(client.acquire_async("async-race", wait=5.0))
            for _ in range(i % 4):
                await asyncio.sleep(0)
            if i % 2:
                await asyncio.sleep(0.0005 * (i % 5))  # sometimes while the worker runs
            task.cancel()
            try:
                lk = await task
            except asyncio.CancelledError:
                outcomes.add("cancelled")
                assert r.exists("async-race") == 0
            else:
                outcomes.add("acquired")
                assert await lk.release() is True
        return outcomes

    outcomes = asyncio.run(main())
    assert "cancelled" in outcomes
    assert r.exists("async-race") == 0
    assert not _registry._LIVE


def test_tasks_sharing_one_async_lock_take_turns(server, client):
    async def main():
        lk = client.lock_async("async-shared", ttl=10.0, wait=30.0)
        counter = [0]

        async def work():
            for _ in range(20):
                async with lk:
                    n = counter[0]
                    await asyncio.sleep(0)
                    counter[0] = n + 1

        await asyncio.wait_for(asyncio.gather(*(work() for _ in range(4))), 60)
        return counter[0]

    assert asyncio.run(main()) == 80
    assert server.redis().exists("async-shared") == 0
    assert not _registry._LIVE
