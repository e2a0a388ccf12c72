"""Reentrant locks from Python (issue 15, items 1 and 4): the holding thread may acquire
again, another thread may not release, a named owner spans clients, the key goes with the
last hold."""

import threading

import pytest

import redlease
from redlease import InvalidArgumentError, LockBusyError, LockNotHeldError


def exists(r, key):
    return r.exists(key) == 1


def test_the_holding_thread_reenters_100_deep_and_the_key_goes_with_the_last(client, r):
    lk = client.lock("py:reentrant", ttl=10.0, wait=0, reentrant=True)
    lk.acquire()
    fence = lk.fencing_token
    for _ in range(99):
        lk.acquire()
    with lk:  # a with block inside is one more hold
        assert lk.held
    others = [client.acquire("py:reentrant", ttl=10.0, wait=0, reentrant=True) for _ in range(3)]
    assert all(o.fencing_token == fence for o in others)
    assert all(o.token == lk.token for o in others)
    for o in others:
        assert o.release()
    for _ in range(99):
        assert lk.release()
        assert exists(r, "py:reentrant")
    assert lk.release()
    assert not exists(r, "py:reentrant")


def test_another_thread_is_refused_and_may_not_release(client, r):
    lk = client.acquire("py:owned", ttl=10.0, wait=0, reentrant=True)
    outcome = {}

    def stranger():
        try:
            client.acquire("py:owned", ttl=10.0, wait=0, reentrant=True)
        except LockBusyError:
            outcome["acquire"] = "busy"
        try:
            lk.release()
        except LockNotHeldError:
            outcome["release"] = "not held"

    t = threading.Thread(target=stranger)
    t.start()
    t.join()
    assert outcome == {"acquire": "busy", "release": "not held"}
    assert lk.held and exists(r, "py:owned")
    assert lk.release()
    assert not exists(r, "py:owned")


def test_a_named_owner_spans_clients(server, r):
    owner = "job-5b0d8c2e-3f4a-4e7b-9c1d-2a6f8e0b4c77"
    with redlease.Client(server.url) as a, redlease.Client(server.url) as b:
        first = a.acquire("py:job", ttl=10.0, wait=0, reentrant=True, owner=owner)
        second = b.acquire("py:job", ttl=10.0, wait=0, reentrant=True, owner=owner)
        assert first.token == second.token
        with pytest.raises(LockBusyError):
            b.acquire("py:job", ttl=10.0, wait=0, reentrant=True, owner="someone-else")
        assert first.release()
        assert exists(r, "py:job")
        assert second.release()
        assert not exists(r, "py:job")


def test_bad_reentrant_arguments_are_refused(client):
    with pytest.raises(InvalidArgumentError):
        client.lock("py:bad", owner="x")  # an owner needs reentrant=True
    with pytest.raises(InvalidArgumentError):
        client.lock("py:bad", reentrant="yes")
    with pytest.raises(InvalidArgumentError):
        client.lock("py:bad", reentrant=True, owner=5)
    with pytest.raises(InvalidArgumentError):
        client.acquire("py:bad", wait=0, reentrant=True, owner="")
    with pytest.raises(InvalidArgumentError):
        client.acquire("py:bad", wait=0, reentrant=True, owner="\ud800")
