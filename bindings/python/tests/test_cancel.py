"""Ending blocked acquires on purpose: CancelToken and cancel_all."""

import threading
import time

import pytest

import redlease
from redlease import (
    CancelToken,
    InvalidArgumentError,
    InvalidHandleError,
    LockCancelledError,
    _registry,
)


def in_thread(fn):
    """Runs fn in a thread; returns (thread, outcome list of (result or exception, when))."""
    outcome = []

    def run():
        try:
            outcome.append((fn(), time.monotonic()))
        except BaseException as exc:  # noqa: BLE001
            outcome.append((exc, time.monotonic()))

    t = threading.Thread(target=run)
    t.start()
    return t, outcome


# How soon a cancelled wait must end: at once, with room for a loaded host; well short of
# the 2 s I/O timeout a withdrawal that did not hurry would wait, and of the waits.
PROMPTLY = 1.5


def wait_for_waiter(r, key, limit=5.0):
    deadline = time.monotonic() + limit
    while r.zcard(f"redlease:queue:{{{key}}}") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert r.zcard(f"redlease:queue:{{{key}}}") == 1, "nobody waits on the server"


def test_a_token_ends_a_blocked_acquire_from_another_thread(client, r):
    holder = client.acquire("cancelled", ttl=10.0, wait=0)
    with CancelToken() as token:
        waiter = client.lock("cancelled", wait=None, cancel=token)
        t, outcome = in_thread(waiter.acquire)
        wait_for_waiter(r, "cancelled")
        cancelled_at = time.monotonic()
        token.cancel()
        t.join(5)
        assert token.cancelled
    assert len(outcome) == 1
    exc, when = outcome[0]
    assert isinstance(exc, LockCancelledError) and exc.status == 3
    assert when - cancelled_at < PROMPTLY
    assert not waiter.held
    assert r.zcard("redlease:queue:{cancelled}") == 0
    assert holder.release() is True
    assert r.exists("cancelled") == 0, "the release was handed to a cancelled waiter"
    assert waiter._last_handle not in _registry._LIVE


def test_a_cancelled_token_stops_later_waits_but_not_single_attempts(client):
    token = CancelToken()
    token.cancel()
    holder = client.acquire("later", wait=0)
    started = time.monotonic()
    with pytest.raises(LockCancelledError):
        client.acquire("later", wait=5.0, cancel=token)
    assert time.monotonic() - started < PROMPTLY
    assert holder.release() is True
    lk = client.acquire("later", wait=0, cancel=token)  # a single attempt does not wait
    assert lk.held
    assert lk.release() is True
    token.close()


def test_a_closed_token_is_refused(client):
    token = CancelToken()
    token.close()
    token.close()  # idempotent
    with pytest.raises(InvalidHandleError):
        token.cancel()
    with pytest.raises(InvalidHandleError):
        client.acquire("closed-token", wait=1.0, cancel=token)
    lk = client.lock("closed-token", wait=0)
    with lk:  # the failed acquire above left nothing behind
        assert lk.held
    assert "closed" in repr(token)


def test_the_cancel_argument_must_be_a_token(client):
    with pytest.raises(InvalidArgumentError):
        client.lock("k", cancel="yes")  # type: ignore[arg-type]


def test_a_token_also_ends_a_wait_for_another_threads_holding_of_the_object(client):
    lk = client.lock("gate-cancel", wait=None)
    lk.acquire()
    token = CancelToken()
    t, outcome = in_thread(lambda: lk.acquire(cancel=token))
    time.sleep(0.2)
    assert not outcome
    cancelled_at = time.monotonic()
    token.cancel()
    t.join(5)
    exc, when = outcome[0]
    assert isinstance(exc, LockCancelledError)
    assert when - cancelled_at < PROMPTLY
    assert lk.held
    assert lk.release() is True
    token.close()


def test_cancel_all_ends_every_wait_until_reset(client, r):
    holders = [client.acquire(f"all-{i}", ttl=10.0, wait=0) for i in range(2)]
    try:
        waits = [in_thread(lambda i=i: client.acquire(f"all-{i}", wait=None)) for i in range(2)]
        for i in range(2):
            wait_for_waiter(r, f"all-{i}")
        cancelled_at = time.monotonic()
        redlease.cancel_all()
        for t, outcome in waits:
            t.join(5)
            exc, when = outcome[0]
            assert isinstance(exc, LockCancelledError)
            assert when - cancelled_at < PROMPTLY
        # Later waits are cancelled too; single attempts are not.
        with pytest.raises(LockCancelledError):
            client.acquire("all-free", wait=1.0)
        client.acquire("all-free", wait=0).release()
    finally:
        redlease.reset_cancel_all()
    lk = client.acquire("all-free", wait=1.0)
    assert lk.release() is True
    for i, holder in enumerate(holders):
        assert holder.release() is True
        assert r.exists(f"all-{i}") == 0
        assert r.zcard(f"redlease:queue:{{all-{i}}}") == 0
