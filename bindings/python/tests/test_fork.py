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


WAIT_FORKED_IN_HANDLER = """
import os, signal, sys, threading, time
import redlease
client = redlease.Client("{url}")
holder = redlease.Client("{url}").acquire("fork-in-handler", ttl=30)
forked = []  # the handler's fork: the child's pid in the parent, 0 in the child
child_status = []


def handler(signum, frame):
    if not forked:
        forked.append(os.fork())


def end_the_child_then_release():
    while not forked:
        time.sleep(0.01)
    # The holder keeps the lock until the child has ended: a child that went on with its
    # parent's wait would end Busy after it (2), or take the parent's grant (1).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done, status = os.waitpid(forked[0], os.WNOHANG)
        if done:
            child_status.append(os.waitstatus_to_exitcode(status))
            break
        time.sleep(0.05)
    else:
        os.kill(forked[0], signal.SIGKILL)
        child_status.append("hung")
    holder.release()


signal.signal(signal.SIGUSR1, handler)
releaser = threading.Thread(target=end_the_child_then_release)
releaser.start()
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
try:
    lk = client.acquire("fork-in-handler", ttl=30, wait=10)
    outcome = "acquired"
except redlease.InternalError:
    outcome = "internal"
except redlease.LockBusyError:
    outcome = "busy"
if forked and forked[0] == 0:
    os._exit({{"internal": 0, "acquired": 1}}.get(outcome, 2))
releaser.join()
assert forked, "the signal handler never ran during the wait"
assert child_status == [0], f"the child went on with its parent's wait: {{child_status}}"
assert outcome == "acquired", outcome
lk.release()
"""


def test_a_child_forked_by_a_signal_handler_does_not_finish_its_parents_wait(server, child_env):
    """A Python signal handler runs on the main thread while it waits in ``acquire`` (the
    library's interrupt hook runs it); one that forks returns into the wait in the child,
    on its parent's connection. The child's acquire must fail (``InternalError``) without
    taking its parent's grant; the parent waits on and gets the lock."""
    child = textwrap.dedent(WAIT_FORKED_IN_HANDLER).format(url=server.url)
    subprocess.run([sys.executable, "-c", child], env=child_env, check=True, timeout=60)
