"""What the interpreter's exit waits for: the give-back of an attempt whose reply never came."""

import socket
import subprocess
import sys
import threading
import time

import pytest

import redlease

class ReplyDroppingProxy:
    """A TCP proxy to ``port``. Once armed (:meth:`arm`), the connections open then lose
    every reply (their requests still reach the server), and each later connection has its
    first request held back for ``delay`` seconds, then dropped if its client has gone
    meanwhile (as if the process had died before sending it)."""

    def __init__(self, port: int, delay: float = 0.5) -> None:
        self.upstream = port
        self.delay = delay
        self.armed = False
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.armed = True

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            late = self.armed
            threading.Thread(target=self._requests, args=(down, up, late), daemon=True).start()
            threading.Thread(target=self._replies, args=(up, down, late), daemon=True).start()

    def _requests(self, down, up, late) -> None:
        first = late
        while True:
            try:
                data = down.recv(65536)
            except OSError:
                data = b""
            if data and first:
                first = False
                time.sleep(self.delay)
                try:
                    gone = down.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    data = b""
            if not data:
                up.close()
                return
            up.sendall(data)

    def _replies(self, up, down, late) -> None:
        while True:
            try:
                data = up.recv(65536)
            except OSError:
                data = b""
            if not data:
                down.close()
                return
            if late or not self.armed:
                try:
                    down.sendall(data)
                except OSError:
                    return


# The child: a client with a 1 s I/O timeout, a pooled connection and the scripts loaded; on "go" it tries the
# lock once, reports the outcome, and ends (through the interpreter's exit, or os._exit
# when given a second argument).
CHILD = r"""
import os, sys
import redlease
client = redlease.Client(sys.argv[1], io_timeout=1.0)
client.acquire("exit:warm", wait=0).release()  # a pooled connection, the scripts loaded
print("ready", flush=True)
sys.stdin.readline()
try:
    client.acquire("exit:attempt", ttl=60, wait=0)
    print("acquired", flush=True)
except redlease.RedisConnectionError as e:
    print("unanswered", flush=True)
if len(sys.argv) > 2:
    os._exit(0)
"""


def _attempt_unanswered_then_exit(server, child_env, *args):
    """Runs the child through a proxy that drops the reply to its attempt (which runs on
    the server) and holds the give-back's new connection back for 0.5 s. Returns the
    key's value once the child has ended."""
    proxy = ReplyDroppingProxy(server.port)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, f"redis://127.0.0.1:{proxy.port}/0", *args],
        env=child_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        proxy.arm()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "unanswered"
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
    return server.redis().get("exit:attempt")


def test_a_script_that_exits_after_an_unanswered_attempt_gives_it_back_first(server, child_env):
    assert _attempt_unanswered_then_exit(server, child_env) is None


def test_os_exit_skips_the_wait_and_leaves_the_attempt_to_its_ttl(server, child_env):
    # What the exit wait prevents (and what makes the test above able to fail): without it
    # the attempt that ran on the server keeps the lock until its ttl.
    assert _attempt_unanswered_then_exit(server, child_env, "skip-exit-wait") is not None
    assert 0 < server.redis().pttl("exit:attempt") <= 60_000


def test_waiting_with_nothing_in_flight_returns_true_at_once():
    assert redlease.wait_for_background_withdrawals(0) is True
    assert redlease.wait_for_background_withdrawals(None) is True
    assert redlease.wait_for_background_withdrawals() is True


@pytest.mark.parametrize("bad", [-1, "1", float("nan"), True])
def test_a_bad_timeout_is_an_argument_error(bad):
    with pytest.raises(redlease.InvalidArgumentError):
        redlease.wait_for_background_withdrawals(bad)
