"""client.lock_all: one lock over several names, all or none, through lock_acquire_all."""

import threading
import time

import pytest

import redlease


def test_two_callers_in_opposite_orders_never_deadlock_nor_overlap(client):
    inside = {"a": 0, "b": 0}
    overlaps = []
    mutex = threading.Lock()

    def run(names):
        for _ in range(40):
            with client.lock_all(names, wait=20):
                with mutex:
                    for k in inside:
                        inside[k] += 1
                        if inside[k] != 1:
                            overlaps.append(k)
                time.sleep(0.001)
                with mutex:
                    for k in inside:
                        inside[k] -= 1

    threads = [threading.Thread(target=run, args=(n,)) for n in (["m:a", "m:b"], ["m:b", "m:a"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not overlaps


def test_all_or_none_with_single_name_locks(client):
    single = client.acquire("m:y", wait=0)
    with pytest.raises(redlease.LockBusyError):
        client.lock_all(["m:z", "m:x", "m:y"], wait=0).acquire()
    assert not client.is_locked("m:x") and not client.is_locked("m:z")
    single.release()
    both = client.lock_all(["m:z", "m:x", "m:y"], wait=0).acquire()
    assert both.held and set(both.fencing_tokens) == {"m:x", "m:y", "m:z"}
    assert all(f > 0 for f in both.fencing_tokens.values())
    with pytest.raises(redlease.LockBusyError):
        client.acquire("m:x", wait=0)
    assert both.release() is True
    assert not both.held


def test_a_lost_name_loses_the_whole_lock(client, r):
    calls = []
    lk = client.lock_all(["m:l1", "m:l2"], ttl=0.3, wait=0,
                         on_lost=lambda m, why: calls.append(why)).acquire()
    r.delete("m:l2")
    assert lk.lost.wait(5)
    assert lk.lost_reason == "not_held" and calls == ["not_held"]
    assert lk.release() is False
    assert not client.is_locked("m:l1")


def test_bad_input_is_refused_before_anything_is_sent(client, r):
    for names in ([], ["a", "a"], ["a", ""], "ab", [1, 2]):
        with pytest.raises(redlease.InvalidArgumentError):
            client.lock_all(names, wait=0).acquire()  # type: ignore[arg-type]
    assert r.dbsize() == 0
    held = client.lock_all(["m:h"], wait=0).acquire()
    with pytest.raises(redlease.InvalidArgumentError):
        held.acquire()
    held.release()
    with pytest.raises(redlease.InvalidHandleError):
        held.release()
