"""A child forked while a library thread is inside the log callback (waiting for the GIL,
which the forking thread holds): the child must not inherit the callback's bookkeeping
locked, or its first change of the log callback (at exit, or at a logging level change,
as multiprocessing workers make) waits for ever."""

import subprocess
import sys
import textwrap

import pytest

CHILD = """
import logging, os, signal, sys, time
import redis
import redlease
handled = []  # when each record about the lock reached Python's logging


class Seen(logging.Handler):
    def emit(self, record):
        if "fork-logging" in record.getMessage():
            handled.append(time.monotonic())


logging.getLogger("redlease").addHandler(Seen())
logging.getLogger("redlease").setLevel(logging.INFO)  # a lost lock is logged at INFO
client = redlease.Client("{url}")
lock = client.lock("fork-logging", ttl=0.3)  # renewed every 0.1 s
lock.acquire()
redis.Redis(host="127.0.0.1", port={port}).delete("fork-logging")  # the next renewal logs
sys.setswitchinterval(30)  # this thread keeps the GIL while the renewal thread logs
end = time.monotonic() + 1.0
while time.monotonic() < end:
    pass
assert not handled, "the renewal thread logged before the fork: nothing tested"
forked_at = time.monotonic()
pid = os.fork()
if pid == 0:
    {in_child}
    os._exit(0)
sys.setswitchinterval(0.005)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.05)
else:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sys.exit("the forked child hung")
assert status == 0, status
# The renewal thread was inside the callback at the fork, waiting for the GIL: its record
# reaches Python's logging after the fork.
end = time.monotonic() + 5
while not handled and time.monotonic() < end:
    time.sleep(0.05)
assert handled and handled[0] > forked_at, handled
"""


@pytest.mark.parametrize(
    "in_child",
    [
        "sys.exit(0)",  # the exit handlers clear the log callback
        'logging.getLogger("redlease").setLevel(logging.ERROR)',
    ],
)
def test_a_child_forked_while_a_library_thread_logs_changes_the_log_callback(
    server, child_env, in_child
):
    child = textwrap.dedent(CHILD).format(url=server.url, port=server.port, in_child=in_child)
    subprocess.run([sys.executable, "-c", child], env=child_env, check=True, timeout=60)
