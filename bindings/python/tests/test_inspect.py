"""The operators' views from Python, through the C ABI: inspect, locks, break_lock, check,
renewal_stats."""

import time

import pytest

import redlease


def test_inspect_shows_the_holder_its_lease_and_fencing_token(client):
    free = client.inspect("i:a")
    assert free.key == "i:a" and free.holder is None and free.remaining is None
    lk = client.acquire("i:a", ttl=10, wait=0)
    info = client.inspect("i:a")
    assert info.holder == lk.token
    assert 5 < info.remaining <= 10
    assert info.fencing_token == lk.fencing_token
    assert info.waiters == 0 and info.reentrant is None
    lk.release()


def test_inspect_shows_a_reentrant_owner_and_its_holds(client):
    first = client.acquire("i:re", wait=0, reentrant=True, owner="py-owner")
    second = client.acquire("i:re", wait=0, reentrant=True, owner="py-owner")
    assert client.inspect("i:re").reentrant == ("py-owner", 2)
    second.release()
    first.release()


def test_locks_lists_the_held_locks_that_match(client):
    held = [client.acquire(name, wait=0) for name in ("i:l:1", "i:l:2", "i:other")]
    infos = client.locks("i:l:*")
    assert sorted(i.key for i in infos) == ["i:l:1", "i:l:2"]
    assert all(i.holder for i in infos)
    assert len(client.locks("i:l:*", limit=1)) == 1
    assert client.locks("i:none:*") == []
    with pytest.raises(redlease.InvalidArgumentError):
        client.locks("*", limit=0)
    with pytest.raises(redlease.InvalidArgumentError):
        client.locks(b"*")  # type: ignore[arg-type]
    for lk in held:
        lk.release()


def test_break_lock_deletes_only_the_holder_shown(client):
    lk = client.acquire("i:brk", wait=0)
    with pytest.raises(redlease.LockNotHeldError):
        client.break_lock("i:brk", "someone-else")
    assert client.is_locked("i:brk")
    client.break_lock("i:brk", client.inspect("i:brk").holder)
    assert not client.is_locked("i:brk")
    with pytest.raises(redlease.LockNotHeldError):
        lk.extend(10)
    assert lk.release() is False


def test_check_reports_the_server(client):
    check = client.check()
    assert check.version.count(".") >= 1
    assert check.maxmemory_policy is not None
    assert check.loses_data_on_restart is True  # the test server has no RDB and no AOF
    assert check.round_trips and all(0 < t < 5 for t in check.round_trips)


def test_renewal_stats_count_renewals(client):
    before = redlease.renewal_stats()
    lk = client.acquire("i:stats", ttl=0.3, wait=0)
    time.sleep(0.7)  # renewed every 0.1 s
    after = redlease.renewal_stats()
    lk.release()
    assert after.renewals >= before.renewals + 2
    assert 0 <= after.lateness_p50 <= after.lateness_p99 <= after.lateness_p999
    assert after.lateness_p999 <= after.max_lateness


def test_the_views_are_refused_on_a_redlock_client(server):
    with redlease.Client.redlock([server.url]) as rl:
        with pytest.raises(redlease.InvalidArgumentError, match="Redlock"):
            rl.inspect("x")
        with pytest.raises(redlease.InvalidArgumentError, match="Redlock"):
            rl.locks()


def test_inspect_tells_the_kind_that_holds_a_name(client):
    sem = client.semaphore("i:sem", 5)
    permits = [sem.acquire(wait=0) for _ in range(2)]
    info = client.inspect("i:sem")
    assert (info.held_as, info.count, info.holder) == ("semaphore", 2, None)
    reader = client.rwlock("i:rw").read(wait=0).acquire()
    assert (client.inspect("i:rw").held_as, client.inspect("i:rw").count) == ("rwlock", 1)
    reader.release()
    writer = client.rwlock("i:rw").write(wait=0).acquire()
    info = client.inspect("i:rw")
    assert (info.held_as, info.count, info.holder) == ("rwlock", 0, writer.token)
    writer.release()
    assert client.inspect("i:rw").held_as is None
    lk = client.acquire("i:mutex", wait=0)
    assert client.inspect("i:mutex").held_as == "mutex"
    lk.release()
    for p in permits:
        p.release()


def test_stats_count_acquisitions_waits_handoffs_and_losses(client, r):
    import threading

    before = redlease.stats()
    holder = client.acquire("i:st", wait=0)
    with pytest.raises(redlease.LockBusyError):
        client.acquire("i:st", wait=0)
    got = []
    waiter = threading.Thread(target=lambda: got.append(client.acquire("i:st", wait=5)))
    waiter.start()
    time.sleep(0.3)
    holder.release()  # handed to the waiter
    waiter.join(10)
    got[0].release()
    doomed = client.acquire("i:st-lost", ttl=0.3, wait=0)
    r.delete("i:st-lost")
    assert doomed.lost.wait(5)
    d = redlease.stats().since(before)
    assert (d.acquisitions, d.busy, d.waits, d.handoffs, d.lost_not_held) == (3, 1, 1, 1, 1)
    assert 0.25 <= d.wait_quantile(0.5) <= d.max_wait
    assert d.wait_quantile(0.99) <= d.max_wait
    assert d.lateness_quantile(0.99) <= d.max_lateness
    with pytest.raises(redlease.InvalidArgumentError):
        d.wait_quantile(0.75)
    with pytest.raises(redlease.InvalidArgumentError):
        d.since("yesterday")  # type: ignore[arg-type]
    assert doomed.release() is False
