"""Fixtures: a real redis-server per test (free port, temp dir, killed by pid), and clients."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

# The source tree's package, unless this run tests an installed one (tests/all.sh).
if not os.environ.get("REDLEASE_EXPECT_INSTALLED"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redlease  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, tmp_path, *extra: str) -> None:
        self.binary = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")
        if not self.binary:
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        self.dir = tmp_path
        self.extra = extra
        self.proc = None
        for _ in range(5):
            self.port = _free_port()
            if self._start():
                return
        pytest.fail(f"redis-server did not start:\n{self.log()}")

    def _start(self) -> bool:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log"),
             *self.extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if self.redis().ping():
                    return True
            except (redis.exceptions.ResponseError, redis.exceptions.AuthenticationError):
                return True  # any answer will do: a server with a password says NOAUTH
            except redis.exceptions.ConnectionError:
                time.sleep(0.01)
        self.stop()
        return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def redis(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, decode_responses=True)

    def log(self) -> str:
        try:
            return (self.dir / "redis.log").read_text()
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server(tmp_path, request):
    srv = RedisServer(tmp_path)
    yield srv
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        print(f"--- redis-server log ---\n{srv.log()}")
    srv.stop()


@pytest.fixture
def client(server):
    c = redlease.Client(server.url)
    yield c
    c.close()


@pytest.fixture
def r(server):
    return server.redis()


@pytest.fixture
def child_env():
    """The environment of a child Python that imports this same package and library."""
    env = dict(os.environ)
    package_parent = str(Path(redlease.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    env["REDLEASE_LIB"] = str(redlease._native.lib_path)
    return env


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
