"""redlease.redis_py: redis-py's Lock interface over redlease.

The first tests are the behaviours of redis-py's own lock tests, run against
``redlease.redis_py.Lock`` through ``r.lock(..., lock_class=...)``; then the documented
differences, threads, errors, exclusion against redis-py's own ``Lock`` in another process,
and the asyncio twin.
"""

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import redis
import redis.asyncio
from redis.exceptions import LockError, LockNotOwnedError

import redlease
import redlease.redis_py as rp


@pytest.fixture
def rb(server):
    """A redis-py client without decode_responses, as redis-py's own tests use."""
    c = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
    yield c
    c.close()


def get_lock(r, *args, **kwargs):
    kwargs["lock_class"] = rp.Lock
    return r.lock(*args, **kwargs)


# --- the behaviours of redis-py's lock tests ---------------------------------------------


def test_lock_is_the_key_holding_the_token(rb):
    lock = get_lock(rb, "foo")
    assert isinstance(lock, rp.Lock)
    assert lock.acquire(blocking=False)
    assert rb.get("foo") == lock.local.token
    lock.release()
    assert rb.get("foo") is None
    assert lock.local.token is None


def test_locked_says_whether_anyone_holds_it(rb):
    lock = get_lock(rb, "foo")
    assert lock.locked() is False
    assert lock.acquire(blocking=False)
    assert lock.locked() is True
    lock.release()
    assert lock.locked() is False
    lock2 = get_lock(rb, "foo")
    assert lock2.acquire(blocking=False)
    assert lock.locked() is True and lock2.locked() is True
    lock2.release()
    assert lock.locked() is False and lock2.locked() is False


def test_owned_is_true_for_the_holding_object_only(rb):
    lock, other = get_lock(rb, "foo"), get_lock(rb, "foo")
    assert lock.owned() is False
    assert lock.acquire(blocking=False)
    assert lock.owned() is True
    assert other.owned() is False
    lock.release()
    assert lock.owned() is False


def test_competing_locks(rb):
    lock1, lock2 = get_lock(rb, "foo"), get_lock(rb, "foo")
    assert lock1.acquire(blocking=False)
    assert not lock2.acquire(blocking=False)
    lock1.release()
    assert lock2.acquire(blocking=False)
    assert not lock1.acquire(blocking=False)
    lock2.release()


def test_int_timeout_is_the_lease(rb):
    lock = get_lock(rb, "foo", timeout=10)
    assert lock.acquire(blocking=False)
    assert 8 < rb.ttl("foo") <= 10
    lock.release()


def test_float_timeout_is_the_lease(rb):
    lock = get_lock(rb, "foo", timeout=9.5)
    assert lock.acquire(blocking=False)
    assert 8000 < rb.pttl("foo") <= 9500
    lock.release()


def test_blocking_timeout_bounds_the_wait(rb):
    lock1 = get_lock(rb, "foo")
    assert lock1.acquire(blocking=False)
    lock2 = get_lock(rb, "foo", blocking_timeout=0.2)
    start = time.monotonic()
    assert lock2.acquire() is False
    took = time.monotonic() - start
    assert 0.2 <= took < 2.0
    start = time.monotonic()
    assert lock2.acquire(blocking_timeout=0.1) is False
    assert 0.1 <= time.monotonic() - start < 2.0
    lock1.release()


def test_a_waiter_is_woken_by_the_release(rb):
    holder = get_lock(rb, "foo")
    assert holder.acquire(blocking=False)
    waiter = get_lock(rb, "foo", blocking_timeout=10)
    got = []

    def wait_then_release():
        got.append((waiter.acquire(), time.monotonic()))
        waiter.release()

    t = threading.Thread(target=wait_then_release)
    t.start()
    time.sleep(0.3)
    released = time.monotonic()
    holder.release()
    t.join(10)
    assert got and got[0][0] is True
    assert got[0][1] - released < 1.0


def test_context_manager_holds_for_the_block(rb):
    with get_lock(rb, "foo", blocking_timeout=0.2) as lock:
        assert rb.get("foo") == lock.local.token
    assert rb.get("foo") is None


def test_context_manager_raises_when_not_acquired(rb):
    rb.set("foo", "bar")
    with pytest.raises(LockError) as info:
        with get_lock(rb, "foo", blocking_timeout=0.1):
            pass
    assert isinstance(info.value, redlease.RedleaseError)
    assert info.value.lock_name == "foo"


def test_releasing_an_unlocked_lock_raises(rb):
    lock = get_lock(rb, "foo")
    with pytest.raises(LockError) as info:
        lock.release()
    assert info.value.lock_name == "foo"
    assert not isinstance(info.value, LockNotOwnedError)


def test_releasing_twice_raises_lock_error(rb):
    lock = get_lock(rb, "foo")
    assert lock.acquire(blocking=False)
    lock.release()
    with pytest.raises(LockError):
        lock.release()


def test_releasing_a_stolen_lock_raises_not_owned_and_clears_the_token(rb):
    lock = get_lock(rb, "foo")
    assert lock.acquire(blocking=False)
    rb.set("foo", "a")
    with pytest.raises(LockNotOwnedError) as info:
        lock.release()
    assert isinstance(info.value, redlease.RedleaseError)
    assert info.value.lock_name == "foo"
    assert lock.local.token is None
    assert rb.get("foo") == b"a"  # the other owner's key is left alone


@pytest.mark.parametrize("timeout,add", [(10, 10), (10.0, 10.0)])
def test_extend_adds_to_the_lease(rb, timeout, add):
    lock = get_lock(rb, "foo", timeout=timeout)
    assert lock.acquire(blocking=False)
    assert 8000 < rb.pttl("foo") <= 10000
    assert lock.extend(add) is True
    assert 16000 < rb.pttl("foo") <= 20000
    lock.release()


def test_extend_with_replace_ttl_sets_the_lease(rb):
    lock = get_lock(rb, "foo", timeout=10)
    assert lock.acquire(blocking=False)
    assert lock.extend(30, replace_ttl=True) is True
    assert 25_000 < rb.pttl("foo") <= 30_000
    # A shorter one never shortens the key (another holder of the token may count on it);
    # the lock itself counts on it.
    assert lock.extend(3, replace_ttl=True) is True
    assert rb.pttl("foo") > 25_000
    assert lock._held().remaining <= 3.0
    lock.release()


def test_extending_an_unlocked_lock_raises(rb):
    with pytest.raises(LockError):
        get_lock(rb, "foo", timeout=10).extend(10)


def test_extending_a_lock_without_timeout_raises(rb):
    lock = get_lock(rb, "foo")
    assert lock.acquire(blocking=False)
    with pytest.raises(LockError):
        lock.extend(10)
    lock.release()


def test_extending_a_stolen_lock_raises_not_owned(rb):
    lock = get_lock(rb, "foo", timeout=10)
    assert lock.acquire(blocking=False)
    rb.set("foo", "a")
    with pytest.raises(LockNotOwnedError):
        lock.extend(10)


def test_reacquire_sets_the_lease_back_to_the_timeout(rb):
    lock = get_lock(rb, "foo", timeout=10)
    assert lock.acquire(blocking=False)
    assert rb.pexpire("foo", 5000)
    assert rb.pttl("foo") <= 5000
    assert lock.reacquire() is True
    assert 8000 < rb.pttl("foo") <= 10000
    lock.release()


def test_reacquiring_unlocked_or_untimed_or_stolen_locks_raises(rb):
    with pytest.raises(LockError):
        get_lock(rb, "foo", timeout=10).reacquire()
    untimed = get_lock(rb, "foo")
    assert untimed.acquire(blocking=False)
    with pytest.raises(LockError):
        untimed.reacquire()
    untimed.release()
    lock = get_lock(rb, "foo", timeout=10)
    assert lock.acquire(blocking=False)
    rb.set("foo", "a")
    with pytest.raises(LockNotOwnedError):
        lock.reacquire()


# --- what redlease adds or does differently ----------------------------------------------


@pytest.mark.parametrize("timeout", [None, 0])  # redis-py takes 0 as no timeout too
def test_a_lock_without_timeout_is_a_lease_renewed_while_held(rb, monkeypatch, timeout):
    monkeypatch.setattr(rp, "RENEWED_TTL", 0.3)
    lock = get_lock(rb, "foo", timeout=timeout)
    assert lock.acquire(blocking=False)
    assert 0 < rb.pttl("foo") <= 300  # it expires if the holder dies
    time.sleep(1.0)  # more than three leases
    assert lock.owned()
    lock.release()
    assert rb.get("foo") is None


def test_a_token_of_the_callers_is_refused(rb):
    lock = get_lock(rb, "foo")
    with pytest.raises(LockError, match="fresh token"):
        lock.acquire(blocking=False, token="test")
    assert rb.get("foo") is None


def test_fencing_tokens_increase_across_holders(rb):
    a, b = get_lock(rb, "foo"), get_lock(rb, "foo")
    assert a.fencing_token is None
    assert a.acquire(blocking=False)
    first = a.fencing_token
    a.release()
    assert b.acquire(blocking=False)
    assert b.fencing_token > first > 0
    b.release()


def test_a_lost_lock_sets_its_lost_event(rb, monkeypatch):
    monkeypatch.setattr(rp, "RENEWED_TTL", 0.3)
    lock = get_lock(rb, "foo")
    assert lock.acquire(blocking=False)
    assert not lock.lost.is_set()
    rb.set("foo", "thief")
    assert lock.lost.wait(5)  # the next renewal (ttl/3) finds it gone


def test_thread_local_holdings_belong_to_their_thread(rb):
    lock = get_lock(rb, "foo")
    assert lock.acquire(blocking=False)
    errors = []

    def release_elsewhere():
        try:
            lock.release()
        except LockError as e:
            errors.append(e)

    t = threading.Thread(target=release_elsewhere)
    t.start()
    t.join()
    assert len(errors) == 1 and not isinstance(errors[0], LockNotOwnedError)
    assert lock.owned()
    lock.release()


def test_without_thread_local_another_thread_may_release(rb):
    lock = get_lock(rb, "foo", thread_local=False)
    assert lock.acquire(blocking=False)
    t = threading.Thread(target=lock.release)
    t.start()
    t.join()
    assert rb.get("foo") is None


@pytest.mark.parametrize("thread_local", [True, False])
def test_local_token_is_the_keys_value_when_first_read_and_may_be_assigned(rb, thread_local):
    lock = get_lock(rb, "foo", timeout=30, thread_local=thread_local)
    # A cycle that never looks at the token works as one that does.
    assert lock.acquire(blocking=False)
    lock.release()
    assert lock.local.token is None
    assert lock.acquire(blocking=False)
    seen = []
    t = threading.Thread(target=lambda: seen.append(lock.local.token))
    t.start()
    t.join()
    # Another thread sees this thread's holding only without thread_local.
    assert seen == [rb.get("foo") if not thread_local else None]
    assert lock.local.token == rb.get("foo")
    assert lock.extend(1)
    # As in redis-py, a token assigned None makes the lock unlocked here.
    lock.local.token = None
    with pytest.raises(LockError, match="unlocked"):
        lock.extend(1)
    lock.local.token = rb.get("foo")
    assert lock.owned()
    lock.release()
    assert rb.get("foo") is None and lock.local.token is None


def test_an_unread_local_token_is_none_once_the_client_closed_the_lock(rb):
    lock = get_lock(rb, "foo", timeout=30)
    assert lock.acquire(blocking=False)
    # What happens when the redis-py pool the shared client serves goes away.
    lock._client._close_now()
    assert lock.local.token is None
    assert rb.get("foo") is None


def test_errors_are_caught_by_redis_py_and_redlease_clauses_alike():
    assert issubclass(rp.LockError, redis.exceptions.LockError)
    assert issubclass(rp.LockError, redlease.RedleaseError)
    assert issubclass(rp.LockNotOwnedError, redis.exceptions.LockNotOwnedError)
    assert issubclass(rp.LockNotOwnedError, rp.LockError)
    assert issubclass(rp.LockNotOwnedError, redlease.RedleaseError)


def test_bad_arguments_raise_before_anything_is_sent(rb):
    with pytest.raises(ValueError):
        get_lock(rb, "foo", timeout=-1)
    with pytest.raises(ValueError):
        get_lock(rb, "")
    with pytest.raises(ValueError):
        get_lock(rb, "foo", blocking_timeout="soon")
    # A lease under the shortest (10 ms), other than 0 (no timeout), is refused at acquire.
    with pytest.raises(redlease.InvalidArgumentError):
        get_lock(rb, "foo", timeout=0.005).acquire(blocking=False)
    assert rb.dbsize() == 0


def test_a_redis_py_lock_in_another_process_and_this_one_never_overlap(rb, server):
    """Each side counts itself in a key while it holds: never more than one inside."""
    other = textwrap.dedent(
        f"""
        import time, redis
        r = redis.Redis(host="127.0.0.1", port={server.port})
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            lk = r.lock("shared", timeout=5, blocking_timeout=5)
            if lk.acquire():
                if r.incr("inside") != 1:
                    r.incr("overlaps")
                r.incr("plain_holds")
                time.sleep(0.001)
                r.decr("inside")
                lk.release()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", other])
    ours = 0
    end = time.monotonic() + 2.0
    try:
        while time.monotonic() < end:
            lk = get_lock(rb, "shared", timeout=5, blocking_timeout=5)
            if lk.acquire():
                if rb.incr("inside") != 1:
                    rb.incr("overlaps")
                ours += 1
                time.sleep(0.001)
                rb.decr("inside")
                lk.release()
    finally:
        assert proc.wait(30) == 0
    assert rb.get("overlaps") is None
    assert ours > 0 and int(rb.get("plain_holds") or 0) > 0


# --- asyncio -----------------------------------------------------------------------------


def test_the_asyncio_twin_behaves_alike(server):
    async def main():
        r = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        try:
            lock = r.lock("foo", lock_class=rp.AsyncLock, timeout=10)
            assert await lock.acquire(blocking=False) is True
            assert await r.get("foo") == lock.local.token
            assert await lock.locked() is True and await lock.owned() is True
            other = r.lock("foo", lock_class=rp.AsyncLock, blocking_timeout=0.1)
            assert await other.acquire() is False
            assert await lock.extend(10) is True
            assert 16000 < await r.pttl("foo") <= 20000
            assert await lock.reacquire() is True
            await lock.release()
            with pytest.raises(LockError):
                await lock.release()
            async with r.lock("foo", lock_class=rp.AsyncLock) as held:
                assert await held.owned()
                await r.set("foo", "thief")
            pytest.fail("the with block should have raised")
        except LockNotOwnedError:
            pass
        finally:
            await r.aclose()

    asyncio.run(main())


def test_a_forgotten_lock_keeps_its_key_until_its_timeout_as_redis_py_does(rb):
    """Callers use a timed lock as "at most once per N seconds": the object goes, the key
    stays until the timeout."""
    assert get_lock(rb, "once", timeout=60).acquire(blocking=False)  # the object is dropped
    import gc

    gc.collect()
    assert 50_000 < rb.pttl("once") <= 60_000
    assert get_lock(rb, "once", timeout=60).acquire(blocking=False) is False

    lock = get_lock(rb, "per-thread", timeout=60)  # thread_local: the holding is the thread's
    t = threading.Thread(target=lambda: lock.acquire(blocking=False))
    t.start()
    t.join()
    gc.collect()
    assert rb.exists("per-thread") == 1
    assert lock.acquire(blocking=False) is False


def test_a_forgotten_lock_in_a_reference_cycle_keeps_its_key(rb):
    """The collector frees a cycle's objects in no set order: the native lock underneath
    must abandon the key as the holding would, not release it."""
    import gc

    class Job:
        def __init__(self):
            self.me = self
            self.lock = get_lock(rb, "cycle", timeout=60)

    job = Job()
    assert job.lock.acquire(blocking=False)
    del job
    gc.collect()
    assert 50_000 < rb.pttl("cycle") <= 60_000


def test_a_lock_held_when_the_process_exits_keeps_its_key(rb, server, child_env):
    """As a redis-py lock left held keeps its key until its timeout, also at exit (the
    clients' exit handler, which closes them, must not release it)."""
    child = textwrap.dedent(
        f"""
        import redis, redlease.redis_py as rp
        r = redis.Redis(host="127.0.0.1", port={server.port})
        kept = r.lock("at-exit", lock_class=rp.Lock, timeout=60)
        assert kept.acquire(blocking=False)
        released = r.lock("released", lock_class=rp.Lock, timeout=60)
        assert released.acquire(blocking=False)
        released.release()
        """
    )
    subprocess.run([sys.executable, "-c", child], env=child_env, check=True, timeout=60)
    assert 50_000 < rb.pttl("at-exit") <= 60_000
    assert rb.exists("released") == 0


def test_redis_failures_are_redis_py_errors_and_redlease_errors(server):
    """A redis-py program's except clauses catch them; redlease's do too."""
    import os
    import signal

    r = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=0.5,
                    socket_connect_timeout=0.5)
    r.hset("a-hash", "f", "v")
    with pytest.raises(redis.exceptions.ResponseError) as server_error:
        get_lock(r, "a-hash", timeout=10).acquire(blocking=False)
    assert isinstance(server_error.value, redlease.RedisServerError)
    held = get_lock(r, "held", timeout=10)
    assert held.acquire(blocking=False)
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(redis.exceptions.TimeoutError) as timed_out:
            get_lock(r, "stopped", timeout=10).acquire(blocking=False)
        assert isinstance(timed_out.value, redlease.RedisConnectionError)
        assert timed_out.value.cause == "timeout"
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()
    for call in (lambda: get_lock(r, "gone", timeout=10).acquire(blocking=False),
                 lambda: held.extend(5), held.release):
        with pytest.raises(redis.exceptions.ConnectionError) as failed:
            call()
        assert isinstance(failed.value, redlease.RedisConnectionError)


def test_an_extend_to_nothing_is_a_lock_error(rb):
    lock = get_lock(rb, "foo", timeout=10)
    assert lock.acquire(blocking=False)
    with pytest.raises(LockError):
        lock.extend(0.001, replace_ttl=True)
    rb.set("foo", "thief")
    with pytest.raises(LockNotOwnedError):
        lock.extend(0)  # lost: not owned, whatever the time asked for


def test_a_forked_child_exits_while_its_parent_renews_a_held_lock(server, child_env):
    """The child has the parent's lock objects but neither the lock nor its renewal thread:
    at exit it must not wait for a renewal that only the parent's thread would end."""
    child = textwrap.dedent(
        f"""
        import os, signal, sys, time, redis
        import redlease.redis_py as rp
        rp.RENEWED_TTL = 0.6  # a renewal every 0.2 s
        r = redis.Redis(host="127.0.0.1", port={server.port})
        lock = r.lock("forked", lock_class=rp.Lock)
        assert lock.acquire()
        os.kill({server.proc.pid}, signal.SIGSTOP)  # the next renewal stays in flight
        try:
            time.sleep(0.45)
            pid = os.fork()
            if pid == 0:
                sys.exit(0)  # the exit handlers run in the child
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.05)
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                sys.exit("the forked child hung at exit")
        finally:
            os.kill({server.proc.pid}, signal.SIGCONT)
        assert status == 0, status
        """
    )
    subprocess.run([sys.executable, "-c", child], env=child_env, check=True, timeout=60)
