"""The native API meets Python habits: locked()/owned(), and acquire(blocking, timeout)
returning True/False as threading.Lock.acquire does."""

import asyncio
import threading
import time

import pytest

import redlease


def test_locked_asks_the_server_and_owned_is_this_objects_view(client, r):
    lk, other = client.lock("h:a", wait=0), client.lock("h:a", wait=0)
    assert lk.locked() is False and lk.owned() is False
    lk.acquire()
    assert lk.locked() is True and lk.owned() is True
    assert other.locked() is True and other.owned() is False
    r.delete("h:a")  # broken behind the holder's back: the server says so at once
    assert lk.locked() is False
    lk.release()
    assert lk.owned() is False


def test_acquire_with_threading_keywords_returns_a_bool(client):
    lk, other = client.lock("h:b"), client.lock("h:b")
    assert lk.acquire(blocking=False) is True
    assert other.acquire(blocking=False) is False
    assert other.acquire(False) is False  # positional, as threading.Lock.acquire(False)
    start = time.monotonic()
    assert other.acquire(timeout=0.2) is False
    assert 0.2 <= time.monotonic() - start < 3.0
    assert not other.owned()
    lk.release()
    assert other.acquire(True, 2) is True
    other.release()


def test_a_waiter_with_a_timeout_gets_the_lock_when_released(client):
    holder, waiter = client.lock("h:c"), client.lock("h:c")
    holder.acquire()
    got = []
    t = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
    t.start()
    time.sleep(0.2)
    holder.release()
    t.join(10)
    assert got == [True]
    waiter.release()


def test_a_non_blocking_acquire_of_a_lock_this_thread_holds_is_false(client):
    lk = client.lock("h:d")
    assert lk.acquire(blocking=False) is True
    assert lk.acquire(blocking=False) is False  # threading.Lock says False, not an error
    with pytest.raises(redlease.InvalidArgumentError):
        lk.acquire()  # it would wait for itself
    lk.release()


def test_threading_argument_rules(client):
    lk = client.lock("h:e")
    with pytest.raises(ValueError, match="non-blocking"):
        lk.acquire(False, 1)
    with pytest.raises(ValueError):
        lk.acquire(timeout=-2)
    assert lk.acquire(1, 0.1) is True  # any truth value, as threading.Lock takes
    assert lk.acquire(0) is False
    lk.release()
    assert not lk.locked()


def test_without_keywords_acquire_keeps_raising_and_returning_the_lock(client):
    lk, other = client.lock("h:f", wait=0), client.lock("h:f", wait=0)
    assert lk.acquire() is lk
    with pytest.raises(redlease.LockBusyError):
        other.acquire()
    lk.release()


def test_is_locked_async(client):
    async def main():
        assert await client.is_locked_async("h:g") is False
        lk = client.acquire("h:g", wait=0)
        assert await client.is_locked_async("h:g") is True
        lk.release()

    asyncio.run(main())
