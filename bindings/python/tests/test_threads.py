"""One Lock object shared by threads behaves like threading.Lock: one holding at a time,
each with its own C handle, and nothing left in the bookkeeping afterwards."""

import threading
import time

import pytest

from redlease import (
    InvalidArgumentError,
    InvalidHandleError,
    LockBusyError,
    LockNotHeldError,
    _locks,
    _registry,
)


def registry_is_empty():
    return not _registry._LIVE and not _registry._EARLY_LOSS


def test_four_threads_share_one_lock_object_and_keep_a_counter_exact(server, client, r):
    lk = client.lock("shared-object", ttl=10.0, wait=30.0)
    rounds, errors, handles = 60, [], set()
    counter = [0]

    def work():
        try:
            for _ in range(rounds):
                with lk:
                    handles.add(lk._handle)
                    n = counter[0]
                    time.sleep(0)
                    counter[0] = n + 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert counter[0] == 4 * rounds
    assert len(handles) == 4 * rounds, "every holding has its own C handle"
    assert registry_is_empty()
    assert r.exists("shared-object") == 0
    assert not lk.held


def test_a_second_thread_waits_for_the_holding_then_acquires_its_own(client, r):
    lk = client.lock("handover", ttl=10.0, wait=5.0)
    lk.acquire()
    first_token, first_fence = lk.token, lk.fencing_token
    got = []

    def other():
        with lk:
            got.append((lk.token, lk.fencing_token, r.get("handover")))

    t = threading.Thread(target=other)
    t.start()
    time.sleep(0.3)
    assert not got, "the second thread did not wait for the first holding"
    assert r.get("handover") == first_token
    assert lk.release() is True
    t.join(10)
    assert len(got) == 1
    token, fence, stored = got[0]
    assert token == stored and token != first_token
    assert fence > first_fence
    assert registry_is_empty()
    assert r.exists("handover") == 0


def test_a_thread_waiting_for_the_object_respects_its_wait(client):
    lk = client.lock("object-wait", ttl=10.0, wait=0.3)
    lk.acquire()
    outcome = []

    def other():
        started = time.monotonic()
        try:
            lk.acquire()
            outcome.append("acquired")
        except LockBusyError:
            outcome.append(time.monotonic() - started)

    t = threading.Thread(target=other)
    t.start()
    t.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], float)
    assert 0.25 <= outcome[0] < 1.5
    # wait=0 does not wait at all.
    nowait = client.lock("object-wait-0", wait=0)
    nowait.acquire()
    failed = []
    t = threading.Thread(target=lambda: failed.append(pytest.raises(LockBusyError, nowait.acquire)))
    t.start()
    t.join(5)
    assert failed
    assert lk.release() is True and nowait.release() is True
    assert registry_is_empty()


def test_acquiring_again_from_the_holding_thread_is_an_error_not_a_deadlock(client):
    lk = client.lock("reentry", wait=None)
    with lk:
        with pytest.raises(InvalidArgumentError):
            lk.acquire()
        assert lk.held
    assert registry_is_empty()


def test_release_by_another_thread_releases_the_current_holding(client, r):
    lk = client.acquire("released-elsewhere", ttl=10.0, wait=0)
    results = []
    t = threading.Thread(target=lambda: results.append(lk.release()))
    t.start()
    t.join(5)
    assert results == [True]
    assert r.exists("released-elsewhere") == 0
    with pytest.raises(InvalidHandleError):
        lk.release()
    assert registry_is_empty()


def test_a_loss_reported_for_an_old_holding_does_not_mark_the_new_one(client, r):
    lk = client.lock("old-loss", ttl=0.3, wait=0)
    lk.acquire()
    r.set("old-loss", "thief")
    assert lk.lost.wait(3.0)
    assert lk.release() is False
    r.delete("old-loss")
    with lk:
        assert not lk.lost.is_set()
        assert lk.lost_reason is None
        lk._lost(lk._last_handle + 1, "not_held")  # a handle this object no longer holds
        assert lk.lost_reason is None and not lk.lost.is_set()
    assert registry_is_empty()


def test_the_holding_of_a_closed_client_ends_with_invalid_handle_and_frees_the_object(server):
    import redlease

    c = redlease.Client(server.url)
    lk = c.lock("closed-under", wait=5.0)
    lk.acquire()
    c.close()
    assert not lk.held
    with pytest.raises(InvalidHandleError):
        lk.release()
    assert registry_is_empty()
    # The object is free again (the client is closed, so acquiring says so).
    with pytest.raises(InvalidHandleError):
        lk.acquire()
    assert lk._gate.acquire(blocking=False)
    lk._gate.release()


def test_lost_in_a_with_block_still_raises_with_threads(client, r):
    lk = client.lock("lost-shared", ttl=0.3, wait=5.0)
    with pytest.raises(LockNotHeldError):
        with lk:
            r.delete("lost-shared")
            assert lk.lost.wait(3.0)
    assert registry_is_empty()


def test_an_acquire_that_ends_after_its_client_was_closed_holds_nothing(server, client, r):
    # Another thread waits on client `c` when `c` is closed. The close cannot release a lock
    # that does not exist yet; the acquire that is granted afterwards once returned a handle
    # that stayed held and renewed, and a Lock no close would ever release.
    import redlease

    c = redlease.Client(server.url)
    holder = client.acquire("closed-meanwhile", ttl=10.0, wait=0)
    lk = c.lock("closed-meanwhile", ttl=10.0, wait=10.0)
    outcome = []

    def wait_for_it():
        try:
            lk.acquire()
            outcome.append("acquired")
        except InvalidHandleError as e:
            outcome.append(e)

    t = threading.Thread(target=wait_for_it)
    t.start()
    time.sleep(0.3)  # blocked in the library, waiting for `holder`
    c.close()
    assert holder.release() is True
    t.join(15)
    assert len(outcome) == 1 and isinstance(outcome[0], InvalidHandleError), outcome
    assert "closed during the acquire" in str(outcome[0])
    assert not lk.held
    assert r.exists("closed-meanwhile") == 0
    assert registry_is_empty()


def test_a_close_between_the_grant_and_its_bookkeeping_leaves_nothing_registered(
    server, r, monkeypatch
):
    # The close runs (on another thread, in real life) after the library granted the lock
    # and before the wrapper recorded it: the wrapper once registered the dead handle, and
    # the entry lived as long as the Lock.
    import redlease

    c = redlease.Client(server.url)
    real = _locks.lib

    class CloseAfterTheFencingToken:
        def __getattr__(self, name):
            return getattr(real, name)

        def lock_fencing_token(self, handle, out):
            status = real.lock_fencing_token(handle, out)
            c.close()
            return status

    monkeypatch.setattr(_locks, "lib", CloseAfterTheFencingToken())
    lk = c.lock("closed-at-adopt", ttl=10.0, wait=0)
    with pytest.raises(InvalidHandleError, match="closed during the acquire"):
        lk.acquire()
    assert not lk.held and lk._handle == 0
    assert registry_is_empty()
    assert r.exists("closed-at-adopt") == 0


def test_a_lock_finalised_while_close_reads_the_registry_never_makes_close_raise(server, r):
    # A held Lock dropped while close() reads the registry (its finaliser runs whenever an
    # allocation starts a collection) pops its own entry meanwhile: close once raised
    # "dictionary changed size during iteration", or KeyError for that entry.
    import redlease

    c = redlease.Client(server.url)
    locks = [c.acquire(f"finalised-{i}", ttl=10.0, wait=0) for i in range(4)]
    dropped = []

    def drop_one():
        if locks:
            lk = locks.pop()
            dropped.append(lk.key)
            del lk  # the finaliser runs here, and pops its entry

    class Meddling(dict):
        """The registry, with a Lock finalised in the middle of every way of reading it."""

        def copy(self):
            snapshot = super().copy()
            drop_one()
            return snapshot

        def items(self):
            for n, item in enumerate(super().items()):
                if n == 1:
                    drop_one()
                yield item

        def get(self, key, default=None):
            found = super().get(key, default)
            drop_one()
            return found

    meddling = Meddling(_registry._LIVE)
    original = _registry._LIVE
    _registry._LIVE = meddling
    try:
        c.close()
    finally:
        original.clear()
        original.update(meddling)
        _registry._LIVE = original
    assert dropped, "no Lock was finalised during the close"
    assert not meddling, dict(meddling)
    assert not locks or all(not lk.held for lk in locks)
    assert all(r.exists(f"finalised-{i}") == 0 for i in range(4))


def test_a_close_waits_for_a_registration_in_progress_before_it_cleans_up(server):
    # Another thread is inside _adopt: it found the client open and is about to register
    # its handle (under _REGISTRY) when close() runs. The cleanup must see that entry; it
    # once read the registry before the registration and left the entry behind.
    import weakref

    import redlease

    c = redlease.Client(server.url)
    lk = c.lock("registering", ttl=10.0, wait=0)
    fake_handle = 0x7FFF_0000_0001  # stands for the handle being registered
    inside = threading.Event()

    def registering():
        with _registry._REGISTRY:
            inside.set()
            time.sleep(0.3)
            _registry._LIVE[fake_handle] = weakref.ref(lk)

    t = threading.Thread(target=registering)
    t.start()
    assert inside.wait(5)
    c.close()
    t.join()
    assert fake_handle not in _registry._LIVE
    assert registry_is_empty()


FINALISER_CLOSES = """
import gc, sys, weakref, redlease
from redlease import _registry

a = redlease.Client(sys.argv[1])
held = a.acquire("finaliser-closes", ttl=10.0, wait=0)

class Owner:
    def __init__(self):
        self.me = self  # a cycle: freed by a collection, at any allocation
        weakref.finalize(self, a.close)

# A collection runs the finaliser (the close) on this thread while it holds the registry
# lock, as one may inside any of the binding's bookkeeping.
Owner()
with _registry._REGISTRY:
    gc.collect()
print("closed", held.held, len(_registry._LIVE), flush=True)
"""


def test_a_finaliser_that_closes_a_client_inside_the_bookkeeping_does_not_hang(
    server, r, child_env
):
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", FINALISER_CLOSES, server.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env,
    )
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the close in a finaliser hung (deadlock)\n{err}")
    assert proc.returncode == 0, err
    assert out.split() == ["closed", "False", "0"], (out, err)
    assert r.exists("finaliser-closes") == 0


def test_a_loss_reported_after_the_close_leaves_nothing_behind(server, r):
    # Two holds of a reentrant lock share one lease; the first hold's handler is slow, so
    # the second hold's report comes after close() returned, for a handle the close already
    # forgot: it was once kept in _EARLY_LOSS for the life of the process.
    import redlease

    c = redlease.Client(server.url)
    in_handler = threading.Event()

    def slow(lock, why):
        in_handler.set()
        time.sleep(1.0)

    first = c.acquire("late-report", ttl=0.3, wait=0, reentrant=True, on_lost=slow)
    second = c.acquire("late-report", ttl=0.3, wait=0, reentrant=True)
    r.delete("late-report")
    assert in_handler.wait(5)
    c.close()
    time.sleep(1.5)  # the second report arrives meanwhile
    assert registry_is_empty(), (dict(_registry._LIVE), dict(_registry._EARLY_LOSS))
    assert not first.held and not second.held


def test_a_second_close_returns_only_once_the_locks_are_released(server, r):
    import redlease

    c = redlease.Client(server.url)
    names = [f"double-close-{i}" for i in range(100)]
    locks = [c.acquire(name, ttl=10.0, wait=0) for name in names]
    first = threading.Thread(target=c.close)
    first.start()
    time.sleep(0.001)
    c.close()  # while the first close is (most likely) still releasing
    still_held = r.exists(*names)
    first.join(10)
    assert still_held == 0, f"{still_held} keys still held when the second close returned"
    assert registry_is_empty()
    assert not any(lk.held for lk in locks)
