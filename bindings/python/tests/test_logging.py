"""The library's log records reach ``logging.getLogger("redlease")`` with matching levels,
from its renewal threads, and a broken handler or filter never hurts the library."""

import logging
import logging.config
import os
import signal
import threading
import time

import pytest

import redlease
from redlease import _logging


def eventually(cond, limit=10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


class Collect(logging.Handler):
    """Keeps the records of the ``redlease`` logger, with the thread each came from."""

    def __init__(self) -> None:
        super().__init__(level=logging.NOTSET)
        self.records = []
        self._mutex = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._mutex:
            self.records.append(record)

    def matching(self, level: int, *words: str):
        with self._mutex:
            return [
                r for r in self.records
                if r.levelno == level and all(w in r.getMessage() for w in words)
            ]


@pytest.fixture
def collect():
    logger = logging.getLogger("redlease")
    handler = Collect()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)
    redlease.set_log_level(logging.WARNING)


def test_levels_map_to_python_levels():
    assert _logging.PYTHON_LEVELS == {
        _logging.LOCK_LOG_ERROR: logging.ERROR,
        _logging.LOCK_LOG_WARN: logging.WARNING,
        _logging.LOCK_LOG_INFO: logging.INFO,
        _logging.LOCK_LOG_DEBUG: logging.DEBUG,
        _logging.LOCK_LOG_TRACE: 5,
    }
    for py, c in [(1, 5), (5, 5), (10, 4), (15, 3), (20, 3), (30, 2), (40, 1), (50, 1)]:
        assert _logging._c_level(py) == c, py
    # Every bad argument is an InvalidArgumentError (also a ValueError), a level too.
    for bad in ["DEBUG", 10.0, True, b"10"]:
        with pytest.raises(redlease.InvalidArgumentError):
            redlease.set_log_level(bad)  # type: ignore[arg-type]


def test_a_renewal_failure_reaches_the_redlease_logger_as_a_warning(server, collect):
    """The server stops answering (SIGSTOP): each failed renewal is a WARNING record of the
    ``redlease`` logger, logged from the lock's renewal thread."""
    redlease.set_log_level(logging.WARNING)
    # Timeouts short enough for a renewal to fail well within the lease (the first, at 1 s,
    # times out at 1.5 s; the lock is lost at 3 s), and long enough for the acquire itself
    # on a loaded host.
    client = redlease.Client(server.url, io_timeout=0.5, connect_timeout=1.0)
    lk = client.acquire("log:paused", ttl=3.0, wait=0)
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        warned = eventually(lambda: collect.matching(logging.WARNING, "log:paused", "failed"))
        lost = lk.lost.wait(10.0)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert warned, [r.getMessage() for r in collect.records]
    assert lost
    record = collect.matching(logging.WARNING, "log:paused", "failed")[0]
    assert record.name == "redlease"
    assert record.redlease_target.startswith("redlease::"), record.redlease_target
    assert record.thread != threading.get_ident(), "logged on the renewal thread"
    assert all(r.levelno >= logging.WARNING for r in collect.records), "below the level asked"
    lk.release()
    client.close()


def test_info_records_arrive_when_asked_for(client, r, collect):
    """A lost lock whose owner is told (Python always is) is an INFO record."""
    redlease.set_log_level(logging.INFO)
    lk = client.acquire("log:deleted", ttl=0.3, wait=0)
    r.delete("log:deleted")
    assert lk.lost.wait(5.0)
    assert eventually(lambda: collect.matching(logging.INFO, "log:deleted", "lost")), [
        (r.levelname, r.getMessage()) for r in collect.records
    ]
    assert lk.release() is False


def test_set_log_level_none_stops_the_records(client, r, collect):
    redlease.set_log_level(None)
    lk = client.acquire("log:off", ttl=0.3, wait=0)
    r.delete("log:off")
    assert lk.lost.wait(5.0)
    time.sleep(0.1)
    assert not collect.records, [r.getMessage() for r in collect.records]
    lk.release()


def test_a_failing_filter_never_reaches_the_library(client, r, collect):
    """The callback swallows whatever logging raises: the renewal thread carries on, and
    the next record arrives."""
    calls = []

    def broken(record):
        calls.append(record)
        if len(calls) == 1:
            raise RuntimeError("a broken filter")
        return True

    logger = logging.getLogger("redlease")
    logger.addFilter(broken)
    try:
        redlease.set_log_level(logging.INFO)
        first = client.acquire("log:broken-1", ttl=0.3, wait=0)
        r.delete("log:broken-1")
        assert first.lost.wait(5.0)
        second = client.acquire("log:broken-2", ttl=0.3, wait=0)
        r.delete("log:broken-2")
        assert second.lost.wait(5.0)
        assert eventually(lambda: collect.matching(logging.INFO, "log:broken-2", "lost"))
    finally:
        logger.removeFilter(broken)
    assert len(calls) >= 2
    first.release()
    second.release()


def test_releases_racing_their_own_renewals_log_no_warning(client, collect):
    """Each hold ends as its renewal (due at a third of the ttl) is queued: the release
    takes the renewal back unsent, which is no failure and no reason for a WARNING."""
    redlease.set_log_level(logging.WARNING)
    others = [client.acquire(f"log:beside-{i}", ttl=0.6, wait=0) for i in range(3)]
    try:
        for _ in range(30):
            lk = client.acquire("log:racing", ttl=0.6, wait=0)
            time.sleep(0.2)
            assert lk.release() is True
    finally:
        for other in others:
            other.release()
    time.sleep(0.1)
    assert not collect.records, [r.getMessage() for r in collect.records]


def test_the_library_follows_the_logger_level_set_after_import(client, r):
    """No set_log_level call: raising the logger's level to INFO after import makes the
    library send its INFO records; lowering it back stops them again. The record names the
    library's thread it came from."""
    logger = logging.getLogger("redlease")
    handler = Collect()
    logger.addHandler(handler)
    old = logger.level
    try:
        logger.setLevel(logging.WARNING)
        assert _logging._applied == logging.WARNING
        lk = client.acquire("log:follow-quiet", ttl=0.3, wait=0)
        r.delete("log:follow-quiet")
        assert lk.lost.wait(5.0)
        time.sleep(0.1)
        assert not handler.matching(logging.INFO, "log:follow-quiet"), "INFO sent at WARNING"
        logger.setLevel(logging.INFO)
        assert _logging._applied == logging.INFO
        lk2 = client.acquire("log:follow-info", ttl=0.3, wait=0)
        r.delete("log:follow-info")
        assert lk2.lost.wait(5.0)
        assert eventually(lambda: handler.matching(logging.INFO, "log:follow-info", "lost"))
        record = handler.matching(logging.INFO, "log:follow-info", "lost")[0]
        assert record.threadName.startswith("redlease-"), record.threadName
        lk.release()
        lk2.release()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def test_a_level_set_on_the_root_logger_or_by_disable_is_followed():
    logger = logging.getLogger("redlease")
    root = logging.getLogger()
    old_root, old_own = root.level, logger.level
    try:
        logger.setLevel(logging.NOTSET)
        root.setLevel(logging.DEBUG)
        assert _logging._applied == logging.DEBUG
        logging.disable(logging.CRITICAL)
        assert _logging._applied == logging.CRITICAL + 1  # nothing sent
        logging.disable(logging.NOTSET)
        assert _logging._applied == logging.DEBUG
    finally:
        logging.disable(logging.NOTSET)
        root.setLevel(old_root)
        logger.setLevel(old_own)


def test_a_level_changed_while_logging_is_locked_is_applied_soon():
    """dictConfig holds logging's lock while it sets levels: the level is applied from a
    short-lived thread, and never deadlocks with a record in flight."""
    logger = logging.getLogger("redlease")
    old = logger.level
    try:
        logging.config.dictConfig({
            "version": 1, "incremental": False, "disable_existing_loggers": False,
            "loggers": {"redlease": {"level": "INFO"}},
        })
        assert eventually(lambda: _logging._applied == logging.INFO, 5.0)
    finally:
        logger.setLevel(old)


def test_a_level_set_by_a_handler_of_a_library_record_is_applied_just_after(client, r):
    """A handler that turns DEBUG on at the first library warning: setLevel inside the
    record's callback cannot reach the library at once (it would wait for itself); it is
    applied right after, and never raises into the handler."""
    logger = logging.getLogger("redlease")
    old = logger.level
    errors = []

    class Escalate(logging.Handler):
        def emit(self, record):
            try:
                logger.setLevel(logging.DEBUG)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    handler = Escalate()
    logger.addHandler(handler)
    try:
        logger.setLevel(logging.INFO)
        lk = client.acquire("log:escalate", ttl=0.3, wait=0)
        r.delete("log:escalate")
        assert lk.lost.wait(5.0)  # an INFO record: the handler raises the level
        assert eventually(lambda: _logging._applied == logging.DEBUG, 5.0)
        assert not errors, errors
        lk.release()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def test_concurrent_level_changes_end_with_the_last_one_applied():
    logger = logging.getLogger("redlease")
    old = logger.level
    try:
        def flip(levels):
            for level in levels * 200:
                logger.setLevel(level)

        threads = [threading.Thread(target=flip, args=([logging.DEBUG, logging.ERROR],)),
                   threading.Thread(target=flip, args=([logging.INFO, logging.WARNING],))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        logger.setLevel(logging.INFO)
        assert eventually(lambda: _logging._applied == logging.INFO, 5.0)
    finally:
        logger.setLevel(old)
