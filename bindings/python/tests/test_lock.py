"""The Python package against a real redis-server: the same behaviours as the Rust tests,
plus threads, processes, fork and interoperation with redis-py."""

import gc
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import redlease
from redlease import (
    InvalidArgumentError,
    InvalidHandleError,
    LockBusyError,
    LockNotHeldError,
    RedisConnectionError,
    RedisServerError,
    RedleaseError,
)


def eventually(cond, limit=5.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_context_manager_holds_the_lock_with_the_token_stored(client, r):
    with client.lock("lock:order:1001", ttl=10.0, wait=1.0) as lk:
        assert lk.held
        assert r.get("lock:order:1001") == lk.token
        assert 0 < r.pttl("lock:order:1001") <= 10_000
        assert isinstance(lk.fencing_token, int) and lk.fencing_token > 0
        assert client.is_locked("lock:order:1001")
        assert 5.0 < lk.remaining <= 10.0
    assert not lk.held
    assert r.exists("lock:order:1001") == 0


def test_busy_with_and_without_wait(client):
    holder = client.acquire("busy", ttl=10.0, wait=0.0)
    with pytest.raises(LockBusyError) as err:
        client.acquire("busy", wait=0.0)
    assert err.value.status == 1
    assert "held by another owner" in str(err.value)
    started = time.monotonic()
    with pytest.raises(LockBusyError):
        client.acquire("busy", wait=0.3)
    assert time.monotonic() - started >= 0.3
    assert holder.release() is True


def test_a_waiter_gets_the_lock_after_release(client):
    holder = client.acquire("handoff", wait=0)
    got = []

    def wait_for_it():
        with client.lock("handoff", wait=10.0) as lk:
            got.append(lk.fencing_token)

    t = threading.Thread(target=wait_for_it)
    t.start()
    time.sleep(0.2)
    assert not got
    holder.release()
    t.join(15)
    assert got and got[0] > holder.fencing_token


def test_release_after_expiry_does_not_touch_the_next_holder(client, r):
    a = client.acquire("timeline", ttl=0.2, wait=0, renew=False)
    assert eventually(lambda: r.exists("timeline") == 0)
    assert not a.held
    b = client.acquire("timeline", ttl=60.0, wait=0)
    with pytest.raises(LockNotHeldError):
        a.extend(0.1)
    assert a.release() is False
    assert r.get("timeline") == b.token
    assert r.pttl("timeline") > 50_000
    assert b.release() is True


def test_leaving_a_with_block_after_losing_the_lock_raises(client, r):
    with pytest.raises(LockNotHeldError):
        with client.lock("lost-in-block", ttl=0.3, wait=0) as lk:
            r.delete("lost-in-block")
            assert lk.lost.wait(3.0)
    # An exception from the block itself is not masked.
    with pytest.raises(KeyError):
        with client.lock("lost-in-block-2", ttl=0.3, wait=0):
            r.delete("lost-in-block-2")
            time.sleep(0.6)
            raise KeyError("the block's own error")


def test_a_with_block_whose_key_was_deleted_says_not_held_not_expired(client, r):
    # The release finds the key gone before any renewal reported it: the message says
    # what is known (not held), not a guess (expired) about a lease with 30 s left.
    with pytest.raises(LockNotHeldError, match=r"\(not_held\)"):
        with client.lock("deleted-in-block", ttl=30.0, wait=0):
            r.delete("deleted-in-block")


def test_renewal_keeps_a_short_lock_for_many_ttls(client, r):
    # A 1 s lease, for three seconds: a 300 ms one would be lost (rightly) if anything
    # stalled its renewal for ~200 ms, as a loaded host can.
    lk = client.acquire("renewed", ttl=1.0, wait=0)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert lk.held
        assert r.get("renewed") == lk.token
        time.sleep(0.05)
    assert not lk.lost.is_set()
    assert lk.release() is True


def test_losing_the_lock_sets_the_event_and_calls_the_handler(client, r):
    calls = []
    # A 1 s lease: renewal finds the key taken ("not_held"); a renewal a loaded host held up
    # past a short lease's end would find it over ("unreachable") instead.
    lk = client.acquire("victim", ttl=1.0, wait=0, on_lost=lambda l, why: calls.append((l, why)))
    r.set("victim", "someone-else")
    assert lk.lost.wait(1.0 / 3 + 1.0), "the loss was not signalled within ttl/3 plus a margin"
    assert eventually(lambda: calls)
    assert calls == [(lk, "not_held")]
    assert lk.lost_reason == "not_held"
    assert not lk.held
    assert lk.release() is False
    assert r.get("victim") == "someone-else"


def test_a_lock_object_can_be_used_again_after_release(client, r):
    lk = client.lock("again", wait=0)
    with lk:
        first = lk.fencing_token
        with pytest.raises(InvalidArgumentError):
            lk.acquire()  # already held
    with lk:
        assert lk.fencing_token > first
        assert r.get("again") == lk.token
    assert r.exists("again") == 0


def test_fencing_tokens_increase_in_acquisition_order(client):
    tokens = []
    for _ in range(20):
        with client.lock("fenced", wait=0) as lk:
            tokens.append(lk.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_eight_threads_keep_a_non_atomic_counter_exact(server, client):
    rounds = 100

    def work():
        r = server.redis()
        for _ in range(rounds):
            with client.lock("counter-lock", ttl=10.0, wait=30.0):
                n = int(r.get("counter") or 0)
                time.sleep(0)
                r.set("counter", n + 1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert server.redis().get("counter") == str(8 * rounds)


def _process_worker(url, port, rounds):
    import redis as redis_py

    r = redis_py.Redis(host="127.0.0.1", port=port, decode_responses=True)
    with redlease.Client(url) as c:
        for _ in range(rounds):
            with c.lock("proc-counter-lock", ttl=10.0, wait=30.0):
                n = int(r.get("proc-counter") or 0)
                time.sleep(0.0005)
                r.set("proc-counter", n + 1)


def test_four_processes_keep_a_non_atomic_counter_exact(server):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_process_worker, args=(server.url, server.port, 50)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert server.redis().get("proc-counter") == str(4 * 50)


def test_fork_while_held_leaves_the_parents_lock_alone(client, r):
    # A 1.5 s lease: after a fork the parent's threads fault in the pages they write (copy on
    # write), which can hold up a renewal of a shorter lease past its end.
    lk = client.acquire("forked", ttl=1.5, wait=0)
    evalsha_before = r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    pid = os.fork()
    if pid == 0:  # the child: must neither renew nor release the parent's lock
        code = 0
        try:
            if lk.held:
                code = 3
            elif lk.release() is not False:
                code = 4
            del lk
            gc.collect()
        except BaseException:  # noqa: BLE001
            code = 5
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert r.get("forked") == lk.token, "the child released the parent's lock"
    time.sleep(3.0)  # two ttls: the parent's renewal keeps it alive
    assert lk.held
    assert r.get("forked") == lk.token
    calls = r.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert calls > evalsha_before
    assert lk.release() is True


RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def test_interoperates_with_the_canonical_protocol_of_redis_py(client, r):
    # redlease holds: a foreign SET NX PX fails.
    lk = client.acquire("shared", ttl=10.0, wait=0)
    assert r.set("shared", "foreign-token", nx=True, px=10_000) is None
    lk.release()
    # The foreign client holds: redlease is busy until the token-checked DEL.
    assert r.set("shared", "foreign-token", nx=True, px=10_000) is True
    with pytest.raises(LockBusyError):
        client.acquire("shared", wait=0.2)
    release = r.register_script(RELEASE_SCRIPT)
    assert release(keys=["shared"], args=["not-mine"]) == 0
    assert release(keys=["shared"], args=["foreign-token"]) == 1
    lk = client.acquire("shared", wait=0)
    assert r.get("shared") == lk.token
    lk.release()


def test_a_blocking_acquire_lets_other_threads_run(client):
    holder = client.acquire("gil", wait=0)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    began = time.monotonic()
    with pytest.raises(LockBusyError):
        client.acquire("gil", wait=0.5)
    ended = time.monotonic()
    stop.set()
    t.join()
    # Ticks well inside the blocking call (not at its edges, where the GIL changes hands in
    # Python code). Were the GIL held during the call, the ticker could run only in the
    # library's interrupt callback (every 200 ms on the main thread): a tick or two.
    inside = [at for at in ticks if began + 0.05 < at < ended - 0.05]
    assert len(inside) >= 10, f"the GIL was held during the blocking call ({len(inside)} ticks)"
    holder.release()


def test_a_lock_dropped_while_held_is_released(client, r):
    def take():
        lk = client.acquire("dropped", ttl=30.0, wait=0)
        assert r.exists("dropped") == 1
        return lk.token

    take()
    gc.collect()
    assert eventually(lambda: r.exists("dropped") == 0)


def test_released_locks_and_closed_clients_raise_invalid_handle(server):
    c = redlease.Client(server.url)
    lk = c.acquire("handles", wait=0)
    assert lk.release() is True
    with pytest.raises(InvalidHandleError):
        lk.release()
    with pytest.raises(InvalidHandleError):
        lk.extend(1.0)
    assert not lk.held
    c.close()
    c.close()  # idempotent
    with pytest.raises(InvalidHandleError):
        c.acquire("handles", wait=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"key": ""},
        {"key": b""},
        {"key": 42},
        {"key": None},
        {"key": b"\xff\xfe"},
        {"key": "nul\0inside"},
        {"key": "x" * 2000},
        {"key": "k", "ttl": 0},
        {"key": "k", "ttl": -1.0},
        {"key": "k", "ttl": math.nan},
        {"key": "k", "ttl": math.inf},
        {"key": "k", "ttl": "30"},
        {"key": "k", "ttl": True},
        {"key": "k", "ttl": 0.0001},
        {"key": "k", "ttl": 0.009},  # the minimum is 10 ms
        {"key": "k", "ttl": 10**400},
        {"key": "k\ud800"},
        {"key": "redlease:k"},  # reserved for companion keys
        {"key": "k", "wait": -1.0},
        {"key": "k", "wait": math.nan},
        {"key": "k", "wait": 1e30},
        {"key": "k", "renew": "yes"},
        {"key": "k", "on_lost": "not callable"},
    ],
)
def test_bad_input_raises_invalid_argument_before_anything_is_sent(client, r, kwargs):
    with pytest.raises(InvalidArgumentError) as err:
        client.acquire(**{"wait": 0, **kwargs})
    assert isinstance(err.value, ValueError)
    assert r.dbsize() == 0


def test_bytes_keys_are_utf8(client, r):
    with client.lock("clé".encode(), wait=0) as lk:
        assert r.get("clé") == lk.token
        assert lk.key == "clé"


@pytest.mark.parametrize(
    "url", ["", "localhost:6379", "http://127.0.0.1:1", "redis://127.0.0.1:1/notadb", 6379]
)
def test_bad_urls_and_options_raise_invalid_argument(url):
    with pytest.raises(InvalidArgumentError):
        redlease.Client(url)


def test_bad_client_options_raise_invalid_argument(server):
    for kwargs in ({"io_timeout": 0}, {"pool_size": 0}, {"connect_timeout": -1}, {"owner_label": "has space"}):
        with pytest.raises(InvalidArgumentError):
            redlease.Client(server.url, **kwargs)


def test_passwords_stay_out_of_reprs_and_errors(tmp_path):
    from conftest import RedisServer

    srv = RedisServer(tmp_path, "--requirepass", "py-s3cret")
    try:
        c = redlease.Client(f"redis://:py-s3cret@127.0.0.1:{srv.port}/0")
        assert "py-s3cret" not in repr(c) and "***" in repr(c)
        with c.lock("pw", wait=0) as lk:
            assert "py-s3cret" not in repr(lk)
        c.close()
        bad = redlease.Client(f"redis://:wrong-pw-xyz@127.0.0.1:{srv.port}/0")
        with pytest.raises(RedisServerError) as err:
            bad.acquire("pw", wait=0)
        assert "wrong-pw-xyz" not in str(err.value)
        assert isinstance(err.value, RedleaseError)
        bad.close()
    finally:
        srv.stop()


def test_an_unreachable_server_raises_a_connection_error(server):
    from conftest import _free_port

    c = redlease.Client(f"redis://127.0.0.1:{_free_port()}/0", connect_timeout=0.5)
    with pytest.raises(RedisConnectionError):
        c.acquire("nowhere", wait=0)
    c.close()


def test_close_releases_the_locks_still_held(server, r):
    c = redlease.Client(server.url)
    lk = c.acquire("closing", wait=0)
    assert r.exists("closing") == 1
    c.close()
    assert r.exists("closing") == 0
    assert not lk.held


def test_version_matches_the_library():
    assert redlease.version() == redlease.__version__


@pytest.mark.skipif(not os.environ.get("REDLEASE_EXPECT_INSTALLED"), reason="not an installed run")
def test_the_installed_package_uses_its_bundled_library():
    from pathlib import Path

    from redlease import _native

    package = Path(redlease.__file__).resolve().parent
    assert "site-packages" in str(package)
    assert _native.lib_path.resolve().parent == package


def test_an_error_carries_its_status_and_message(client):
    holder = client.acquire("status", wait=0)
    with pytest.raises(LockBusyError) as err:
        client.acquire("status", wait=0)
    assert err.value.status == LockBusyError.status == 1
    assert "status" in str(err.value)
    holder.release()


def test_errors_say_whether_the_outcome_is_unknown_and_why(server):
    """A refused connection sent nothing; a paused server's acquire went out and got no
    reply: outcome_unknown, cause "timeout"."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with redlease.Client(f"redis://127.0.0.1:{port}/0") as nowhere:
        with pytest.raises(redlease.RedisConnectionError) as info:
            nowhere.acquire("x", wait=0)
    assert info.value.outcome_unknown is False and info.value.cause == "connection"

    with redlease.Client(server.url, io_timeout=0.3) as client:
        client.acquire("warm", wait=0).release()
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(redlease.RedisConnectionError) as info:
                client.acquire("x", wait=0)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
    assert info.value.outcome_unknown is True and info.value.cause == "timeout"
    with redlease.Client(server.url) as client:
        held = client.acquire("y", wait=0)
        with pytest.raises(redlease.LockBusyError) as busy:
            client.acquire("y", wait=0)
        held.release()
    assert busy.value.outcome_unknown is False and busy.value.cause is None


def test_the_interpreter_exits_cleanly_while_held_locks_are_being_lost(server, child_env):
    """Locks lost around interpreter exit: the lost-lock callbacks must not reach a
    finalising interpreter (a library thread calling into it then aborts the process).
    Every client still open is closed at exit, which stops their renewal threads."""
    script = (
        "import redis, redlease, sys\n"
        f"r = redis.Redis(host='127.0.0.1', port={server.port})\n"
        f"c = redlease.Client('{server.url}')\n"
        "locks = [c.acquire(f'exit{i}', ttl=0.05 * (1 + i % 5)) for i in range(40)]\n"
        "r.delete(*[f'exit{i}' for i in range(40)])\n"
    )
    for _ in range(4):
        proc = subprocess.run([sys.executable, "-c", script], env=child_env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr


def test_a_lock_handed_to_another_process_is_adopted_by_its_token(server, child_env):
    """The scheduler takes the lock and hands its token to a worker process, which adopts
    it, extends it and releases it; the scheduler then finds it lost."""
    with redlease.Client(server.url) as scheduler:
        held = scheduler.acquire("handed", ttl=10, wait=0)
        worker = (
            "import redlease, sys\n"
            f"c = redlease.Client('{server.url}')\n"
            "lk = c.adopt('handed', sys.argv[1], ttl=5)\n"
            "print(lk.fencing_token, lk.token == sys.argv[1], 4 < lk.remaining <= 10)\n"
            "lk.extend(20)\n"
            "print(lk.release())\n"
        )
        proc = subprocess.run([sys.executable, "-c", worker, held.token], env=child_env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [str(held.fencing_token), "True", "True", "True"]
        with pytest.raises(redlease.LockNotHeldError):
            held.extend(10)
        assert held.lost.is_set()
        with pytest.raises(redlease.LockNotHeldError):
            scheduler.adopt("handed", held.token)
        with pytest.raises(redlease.InvalidArgumentError):
            scheduler.adopt("handed", "")
        assert held.release() is False
