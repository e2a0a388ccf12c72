"""Signals and a blocked acquire: Ctrl-C ends it promptly and leaves nothing held; a signal
that is not meant to stop anything does not end it."""

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import redlease
from redlease import LockBusyError, _registry

# An exception escaping a ctypes callback is printed and dropped ("Exception ignored on
# calling ctypes callback function"), and the library gets an undefined return value.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")

CHILD = textwrap.dedent(
    """
    import sys, time
    import redlease

    url, key, how = sys.argv[1:4]
    client = redlease.Client(url)
    if how == "elsewhere":
        # The signal reaches another thread, so it does not interrupt the acquire's poll:
        # the library's periodic on_interrupt call must notice it.
        import signal, threading
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    print("blocking", flush=True)
    try:
        if how == "with":
            with client.lock(key, ttl=10.0, wait=None):
                print("acquired", flush=True)
        else:
            client.acquire(key, ttl=10.0, wait=None)
            print("acquired", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        from redlease import _registry
        print("registry", len(_registry._LIVE), len(_registry._EARLY_LOSS), flush=True)
        time.sleep(0.5)  # still alive while the test checks that nothing is held
        sys.exit(0)
    sys.exit(3)
    """
)




class Lines:
    """The child's output lines, read by a thread so that waiting for one has a bound."""

    def __init__(self, stream):
        self._lines = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            self._lines.put(line.strip())
        self._lines.put(None)

    def next(self, limit):
        """The next line, or None at the end or after `limit` seconds."""
        try:
            return self._lines.get(timeout=limit)
        except queue.Empty:
            return None


@pytest.mark.parametrize("how", ["acquire", "with", "elsewhere"])
def test_ctrl_c_interrupts_a_blocked_acquire_promptly_and_leaves_nothing(client, r, how, child_env):
    key = f"sigint-{how}"
    holder = client.acquire(key, ttl=10.0, wait=0)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, client.url, key, how],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env,
    )
    lines = Lines(proc.stdout)
    try:
        assert lines.next(10) == "blocking", proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.3)  # the child is in the C acquire by now
        deadline = time.monotonic() + 5
        while r.zcard(f"redlease:queue:{{{key}}}") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.zcard(f"redlease:queue:{{{key}}}") == 1, "the child is not waiting on the server"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        line = lines.next(5)
        took = time.monotonic() - sent
        assert line == "interrupted", f"got {line!r}"
        # Promptly (milliseconds, at most a 200 ms slice where the signal reaches another
        # thread), with room for a loaded host; well short of the 2 s I/O timeout a slow
        # withdrawal would wait.
        assert took < 1.5, f"KeyboardInterrupt took {took:.3f} s"
        print(f"KeyboardInterrupt after {took * 1000:.0f} ms")
        assert lines.next(5) == "registry 0 0"
        # The child is still alive and holds nothing: not registered as a waiter...
        assert r.zcard(f"redlease:queue:{{{key}}}") == 0
        assert proc.poll() is None
        # ... and the release is not handed to it.
        assert holder.release() is True
        assert r.exists(key) == 0
        assert proc.wait(10) == 0
        assert r.exists(key) == 0
        assert r.zcard(f"redlease:queue:{{{key}}}") == 0
        stderr = proc.stderr.read()
        assert "Exception ignored" not in stderr and "Traceback" not in stderr, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_a_signal_whose_handler_returns_does_not_end_the_wait(client):
    holder = client.acquire("sigusr1", ttl=10.0, wait=0)
    seen = []

    def on_usr1(signum, frame):
        seen.append(time.monotonic())

    previous = signal.signal(signal.SIGUSR1, on_usr1)
    try:
        # Signal this thread four times during a 2.5 s wait, each signal only once the
        # handler has run for the one before: two signals pending at once would merge into
        # one, in the kernel or in Python, and the count would say nothing about the library.
        def poke():
            for i in range(4):
                time.sleep(0.1)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
                deadline = time.monotonic() + 1.0
                while len(seen) <= i and time.monotonic() < deadline:
                    time.sleep(0.005)

        t = threading.Thread(target=poke)
        started = time.monotonic()
        t.start()
        waiter = client.lock("sigusr1", wait=2.5)
        with pytest.raises(LockBusyError):
            waiter.acquire()
        ended = time.monotonic()
        assert signal.getsignal(signal.SIGUSR1) is on_usr1, "the handler was put back"
        t.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert len(seen) == 4, "the Python handler ran for every signal"
    assert all(at < ended for at in seen), "the handlers ran during the wait, not after it"
    took = ended - started
    assert 2.45 <= took < 4.0, f"the wait ended after {took:.3f} s"
    assert not waiter.held and waiter._last_handle == 0
    assert holder.release() is True
    assert holder._last_handle not in _registry._LIVE


def test_a_signal_handler_that_raises_ends_the_wait_with_its_exception(client, r):
    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop()

    holder = client.acquire("sigusr2", ttl=10.0, wait=0)
    previous = signal.signal(signal.SIGUSR2, handler)
    try:
        sent = []

        def send():
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGUSR2)

        timer = threading.Timer(0.3, send)
        timer.start()
        waiter = client.lock("sigusr2", wait=10.0)
        with pytest.raises(Stop):
            waiter.acquire()
        # Counted from the signal (a late timer thread is no fault of the library); a wait
        # the signal did not end lasts 10 s.
        assert sent and time.monotonic() - sent[0] < 1.0
        assert signal.getsignal(signal.SIGUSR2) is handler, "the handler was put back"
        timer.join()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert not waiter.held and waiter._last_handle == 0
    assert waiter._gate.acquire(blocking=False), "the object is free again"
    waiter._gate.release()
    assert r.zcard("redlease:queue:{sigusr2}") == 0
    assert holder.release() is True
    assert r.exists("sigusr2") == 0
