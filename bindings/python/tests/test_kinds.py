"""Counting semaphores and read-write locks from Python, against a real redis-server: the
cases of the C tests (bindings/c/tests/test_kinds.c), plus context managers, threads and
interrupted waits. A permit and a read or write hold are ordinary Lock objects."""

import os
import signal
import threading
import time
from ctypes import byref

import pytest

import redlease
from redlease import (
    InvalidArgumentError,
    InvalidHandleError,
    LockBusyError,
    LockCancelledError,
    LockNotHeldError,
    RedisServerError,
    _native,
    _registry,
)


def eventually(cond, limit=5.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def registry_is_empty():
    return not _registry._LIVE and not _registry._EARLY_LOSS


def test_a_semaphore_of_two_admits_two_and_a_release_frees_a_permit(client, r):
    sem = client.semaphore("sem", 2)
    a = sem.acquire(ttl=10.0, wait=0)
    b = sem.acquire(ttl=10.0, wait=0)
    assert isinstance(a, redlease.Lock) and a.held and b.held
    assert r.zcard("sem") == 2
    with pytest.raises(LockBusyError) as err:
        sem.acquire(wait=0)
    assert err.value.status == 1
    started = time.monotonic()
    with pytest.raises(LockBusyError):
        sem.acquire(wait=0.2)
    assert time.monotonic() - started >= 0.2
    assert 0 < a.fencing_token < b.fencing_token
    assert client.is_locked("sem")

    # A release frees a permit.
    assert a.release() is True
    assert r.zcard("sem") == 1
    c = sem.acquire(ttl=10.0, wait=0)
    assert c.fencing_token > b.fencing_token

    # A blocked waiter is woken by a release, long before its 10 s wait is over: it gets the
    # permit after the release, not before (however late its thread started).
    got = []

    def waiter():
        permit = client.semaphore("sem", 2).acquire(ttl=10.0, wait=10.0)
        got.append((permit, time.monotonic()))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    assert not got
    released_at = time.monotonic()
    assert b.release() is True
    t.join(15)
    assert got, "the waiter did not get the freed permit"
    permit, granted_at = got[0]
    assert released_at <= granted_at < released_at + 3.0
    assert permit.release() is True and c.release() is True
    assert r.exists("sem") == 0
    assert registry_is_empty()


def test_a_permit_is_an_ordinary_lock(client, r):
    permit = client.semaphore("permit", 3).acquire(ttl=10.0, wait=0)
    assert permit.held
    assert permit.fencing_token > 0
    assert r.zscore("permit", permit.token) is not None  # the token is the permit's member
    permit.extend(60.0)
    assert 30.0 < permit.remaining <= 60.0
    assert r.pttl("permit") > 30_000
    with pytest.raises(InvalidArgumentError):
        permit.extend(0.005)  # the same ttl floor as a lock
    assert permit.release() is True
    assert r.exists("permit") == 0
    # Released: the handle is spent.
    assert not permit.held and permit.remaining == 0.0
    with pytest.raises(InvalidHandleError):
        permit.release()
    with pytest.raises(InvalidHandleError):
        permit.extend(1.0)

    # A fixed lease frees the permit after its ttl (the server's clock); the late release
    # says it had been lost. 0.5 s: a loaded host may take longer than a shorter lease to
    # confirm the grant (and then rightly holds nothing).
    fixed = client.semaphore("permit", 1).acquire(ttl=0.5, wait=0, renew=False)
    time.sleep(1.0)
    assert not fixed.held
    other = client.semaphore("permit", 1).acquire(ttl=10.0, wait=0)
    with pytest.raises(LockNotHeldError):
        fixed.extend(1.0)
    assert fixed.release() is False
    assert r.zcard("permit") == 1  # the new holder's permit is untouched
    assert other.release() is True

    # The lost signal: a permit taken away behind its back. A 1 s lease: renewal finds the
    # permit gone ("not_held"); a renewal a loaded host held up past a short lease's end
    # would find it over ("unreachable") instead.
    calls = []
    lost = client.semaphore("permit", 2).acquire(
        ttl=1.0, wait=0, on_lost=lambda lk, why: calls.append((lk, why))
    )
    assert r.zrem("permit", lost.token) == 1
    assert lost.lost.wait(3.0)
    assert eventually(lambda: calls)
    assert calls == [(lost, "not_held")]
    assert lost.lost_reason == "not_held" and not lost.held
    assert lost.release() is False
    assert registry_is_empty()


def test_permits_must_be_a_positive_count(client, r):
    with pytest.raises(InvalidArgumentError) as err:
        client.semaphore("zero", 0).acquire(wait=0)
    assert "permit" in str(err.value)
    with pytest.raises(InvalidArgumentError):
        client.semaphore("zero", 0).acquire(wait=1.0)
    for bad in (-1, 2**32, "3", True, 1.5, None):
        with pytest.raises(InvalidArgumentError):
            client.semaphore("zero", bad)
    with pytest.raises(InvalidArgumentError):
        client.semaphore("", 2)
    with pytest.raises(InvalidArgumentError):
        client.semaphore("redlease:x", 2).acquire(wait=0)
    with pytest.raises(InvalidArgumentError):
        client.rwlock("rw").read(ttl=-1)
    with pytest.raises(InvalidArgumentError):
        client.rwlock("rw").read(ttl=0).acquire()
    with pytest.raises(InvalidArgumentError):
        client.rwlock("rw").write(ttl=0.005).acquire()
    with pytest.raises(InvalidArgumentError):
        client.rwlock(b"\xff")
    assert r.dbsize() == 0  # nothing was sent


def test_readers_overlap_and_a_writer_excludes_everyone(client, r):
    rw = client.rwlock("rw")
    r1 = rw.read(ttl=10.0, wait=0).acquire()
    r2 = rw.read(ttl=10.0, wait=0).acquire()
    assert r1.held and r2.held
    assert 0 < r1.fencing_token < r2.fencing_token
    with pytest.raises(LockBusyError):
        rw.write(wait=0).acquire()
    with pytest.raises(LockBusyError):
        rw.write(wait=0.2).acquire()
    r2.extend(60.0)
    assert r2.remaining > 30.0
    assert r1.release() is True
    with pytest.raises(LockBusyError):
        rw.write(wait=0).acquire()  # one reader is still in
    assert r2.release() is True

    w = rw.write(ttl=10.0, wait=0).acquire()
    assert w.fencing_token > r2.fencing_token
    with pytest.raises(LockBusyError):
        rw.read(wait=0).acquire()
    with pytest.raises(LockBusyError):
        rw.write(wait=0).acquire()
    w.extend(20.0)
    assert w.release() is True
    with pytest.raises(InvalidHandleError):
        w.release()
    assert r.exists("rw") == 0
    with rw.read(wait=0) as reading:  # free again
        assert reading.held
    assert registry_is_empty()


def test_a_waiting_writer_keeps_new_readers_out(client, r):
    rw = client.rwlock("rw-wait")
    reader = rw.read(ttl=10.0, wait=0).acquire()
    got = []
    t = threading.Thread(target=lambda: got.append(rw.write(ttl=10.0, wait=10.0).acquire()))
    t.start()
    # Once the writer waits, a new reader is busy although only a reader holds. Before it
    # waits, a new reader may still get in: give that hold back and look again.
    busy = False
    deadline = time.monotonic() + 5
    while not busy and time.monotonic() < deadline:
        try:
            rw.read(wait=0).acquire().release()
            time.sleep(0.02)
        except LockBusyError:
            busy = True
    assert busy, "new readers still got in while a writer waited"
    assert not got
    assert reader.release() is True
    t.join(10)
    assert got, "the writer did not get in once the reader left"
    writer = got[0]
    assert writer.held
    with pytest.raises(LockBusyError):
        rw.read(wait=0).acquire()
    assert writer.release() is True
    assert rw.read(wait=0).acquire().release() is True
    assert registry_is_empty()


def test_a_name_in_use_by_another_kind_raises_a_server_error_that_says_so(client, r):
    mutex = client.acquire("kind", ttl=10.0, wait=0)
    for take in (
        lambda: client.semaphore("kind", 2).acquire(wait=0),
        lambda: client.rwlock("kind").read(wait=0).acquire(),
        lambda: client.rwlock("kind").write(wait=0).acquire(),
    ):
        with pytest.raises(RedisServerError) as err:
            take()
        assert err.value.status == -4
        assert "another kind" in str(err.value)
    assert mutex.held
    assert mutex.release() is True

    permit = client.semaphore("kind", 2).acquire(wait=0)
    with pytest.raises(RedisServerError) as err:
        client.acquire("kind", wait=0)
    assert "another kind" in str(err.value)
    with pytest.raises(RedisServerError) as err:
        client.rwlock("kind").write(wait=0).acquire()
    assert "another kind" in str(err.value)
    assert permit.release() is True
    assert r.exists("kind") == 0
    assert registry_is_empty()


def test_the_c_functions_refuse_a_bad_side_and_null_pointers(client, r):
    lib, out = _native.lib, _native.lock_t(0x5CA1AB1E)
    handle = client.handle
    for side in (0, 3, -1, 2**31 - 1):
        assert lib.lock_rwlock_acquire(handle, b"c-args", side, 10000, 0, None, byref(out)) == -1
        assert "side" in _native.last_error()
    with pytest.raises(InvalidArgumentError):
        _native.check(lib.lock_rwlock_acquire(handle, b"c-args", 3, 10000, 0, None, byref(out)))
    assert lib.lock_semaphore_acquire(handle, b"c-args", 0, 10000, 0, None, byref(out)) == -1
    assert lib.lock_semaphore_acquire(handle, None, 2, 10000, 0, None, byref(out)) == -1
    assert "name" in _native.last_error()
    assert lib.lock_semaphore_acquire(handle, b"c-args", 2, 10000, 0, None, None) == -1
    assert "out_lock" in _native.last_error()
    assert lib.lock_rwlock_acquire(handle, None, 1, 10000, 0, None, byref(out)) == -1
    assert lib.lock_rwlock_acquire(handle, b"c-args", 2, 10000, 0, None, None) == -1
    assert lib.lock_semaphore_acquire(0, b"c-args", 2, 10000, 0, None, byref(out)) == -2
    assert lib.lock_rwlock_acquire(0, b"c-args", 1, 10000, 0, None, byref(out)) == -2
    assert out.value == 0x5CA1AB1E  # outputs are written only on LOCK_OK
    assert r.dbsize() == 0  # nothing was sent


def test_context_managers_release_at_the_end(client, r):
    with client.semaphore("api", 2).acquire(ttl=10.0) as permit:
        assert permit.held
        assert r.zscore("api", permit.token) is not None
    assert not permit.held
    assert r.exists("api") == 0

    rw = client.rwlock("cm")
    with rw.read(ttl=10.0, wait=1.0) as a, rw.read(ttl=10.0, wait=1.0) as b:
        assert a.held and b.held and a.token != b.token
        with pytest.raises(LockBusyError):
            rw.write(wait=0).acquire()
    with rw.write(ttl=10.0, wait=1.0) as w:
        assert w.held
    assert r.exists("cm") == 0

    # The same takeover for a mutex acquired with client.acquire; a with block inside the
    # one that holds is still refused (it would wait for itself).
    with client.acquire("cm-mutex", ttl=10.0, wait=0) as lk:
        assert lk.held
        with pytest.raises(InvalidArgumentError):
            with lk:
                pass
        assert lk.held
    assert r.exists("cm-mutex") == 0

    # A permit lost in the block: leaving it normally raises.
    with pytest.raises(LockNotHeldError):
        with client.semaphore("api", 2).acquire(ttl=0.3) as permit:
            r.zrem("api", permit.token)
            assert permit.lost.wait(3.0)
    assert registry_is_empty()


def test_a_semaphore_of_three_never_lets_a_fourth_thread_in(client):
    sem = client.semaphore("pool", 3)
    guard = threading.Lock()
    inside, peak, rounds, errors, done = [0], [0], 3, [], []

    def work():
        try:
            for _ in range(rounds):
                with sem.acquire(ttl=10.0, wait=60.0):
                    with guard:
                        inside[0] += 1
                        peak[0] = max(peak[0], inside[0])
                    time.sleep(0.2)  # long enough for three holds to overlap on a loaded host
                    with guard:
                        inside[0] -= 1
            done.append(1)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(done) == 9, "every thread made all its rounds"
    assert peak[0] == 3, f"{peak[0]} threads were inside at once"
    assert inside[0] == 0
    assert registry_is_empty()


def test_a_redlock_client_refuses_semaphores_and_read_write_locks(server):
    with redlease.Client.redlock([server.url]) as redlock:
        with pytest.raises(InvalidArgumentError) as err:
            redlock.semaphore("rl", 2).acquire(wait=0)
        assert "Redlock" in str(err.value)
        with pytest.raises(InvalidArgumentError):
            redlock.rwlock("rl").read(wait=0).acquire()
        with pytest.raises(InvalidArgumentError):
            redlock.rwlock("rl").write(wait=0).acquire()


def test_blocked_waits_release_the_gil_and_end_on_cancel_or_a_signal(client, r):
    """The machinery of client.acquire: the GIL is released, a CancelToken ends the wait,
    and a signal handler that raises ends it with its exception; nothing held after."""
    permit = client.semaphore("blocked", 1).acquire(ttl=10.0, wait=0)
    writer = client.rwlock("blocked-rw").write(ttl=10.0, wait=0).acquire()

    ticks, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        with redlease.CancelToken() as token:
            cancelled_at = []

            def cancel():
                cancelled_at.append(time.monotonic())
                token.cancel()

            threading.Timer(0.5, cancel).start()
            started = time.monotonic()
            with pytest.raises(LockCancelledError):
                client.semaphore("blocked", 1).acquire(wait=None, cancel=token)
            ended = time.monotonic()
            # Ended by the cancel (not before it), promptly: well short of the 2 s I/O
            # timeout a slow withdrawal would wait.
            assert cancelled_at and cancelled_at[0] <= ended < cancelled_at[0] + 1.5
        # Ticks well inside the blocking call. Were the GIL held during the call, the ticker
        # could run only in the library's interrupt callback (every 200 ms on the main
        # thread): a tick or two.
        inside = [at for at in ticks if started + 0.05 < at < ended - 0.05]
        assert len(inside) >= 10, f"another thread could not run while the acquire blocked ({len(inside)} ticks)"
    finally:
        stop.set()
        ticker.join()

    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop()

    previous = signal.signal(signal.SIGUSR2, handler)
    try:
        for take in (
            lambda: client.semaphore("blocked", 1).acquire(wait=10.0),
            lambda: client.rwlock("blocked-rw").read(wait=10.0).acquire(),
        ):
            sent = []

            def send(sent=sent):
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGUSR2)

            timer = threading.Timer(0.3, send)
            timer.start()
            with pytest.raises(Stop):
                take()
            # Counted from the signal (a late timer thread is no fault of the library); a
            # wait the signal did not end lasts 10 s.
            assert sent and time.monotonic() - sent[0] < 1.0
            timer.join()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert r.zcard("blocked") == 1  # only the holder's permit
    assert permit.release() is True and writer.release() is True
    assert r.exists("blocked") == 0 and r.exists("blocked-rw") == 0
    assert registry_is_empty()


def test_closing_the_client_releases_permits_and_holds(server, r):
    c = redlease.Client(server.url)
    permit = c.semaphore("closing", 2).acquire(wait=0)
    reading = c.rwlock("closing-rw").read(wait=0).acquire()
    assert r.exists("closing") == 1 and r.exists("closing-rw") == 1
    c.close()
    assert registry_is_empty()  # before any Lock object is touched again
    assert r.exists("closing") == 0 and r.exists("closing-rw") == 0
    assert not permit.held and not reading.held
    for hold in (permit, reading):
        with pytest.raises(InvalidHandleError):
            hold.release()
    assert registry_is_empty()


def test_reprs_say_what_is_held(client):
    sem = client.semaphore("shown", 2)
    assert repr(sem) == "<redlease.Semaphore 'shown' permits=2>"
    assert repr(client.rwlock("shown-rw")) == "<redlease.RwLock 'shown-rw'>"
    with sem.acquire(wait=0) as permit:
        assert repr(permit).startswith("<redlease.Lock semaphore 'shown' held=True")
    assert repr(client.rwlock("shown-rw").read()) == "<redlease.Lock read-write lock 'shown-rw' (read) not held>"
    assert repr(client.lock("shown-mutex")) == "<redlease.Lock 'shown-mutex' not held>"
