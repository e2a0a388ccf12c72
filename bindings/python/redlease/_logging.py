"""The library's log records, forwarded to ``logging.getLogger("redlease")``.

The library (renewal threads included) hands each record to one C callback
(``lock_set_log_callback``); this module's callback turns it into a record of the
``redlease`` logger at the matching level:

======================  ===================
C level                 Python level
======================  ===================
``LOCK_LOG_ERROR``      ``logging.ERROR``
``LOCK_LOG_WARN``       ``logging.WARNING``
``LOCK_LOG_INFO``       ``logging.INFO``
``LOCK_LOG_DEBUG``      ``logging.DEBUG``
``LOCK_LOG_TRACE``      ``5`` (below DEBUG)
======================  ===================

The record's ``redlease_target`` attribute names the part of the library that wrote it
(``"redlease::renewal"``, ...), and its ``threadName`` the library's thread
(``redlease-renew``, ...) rather than ``Dummy-1``. Which records the library sends at all
follows the ``redlease`` logger's effective level: set at import, and again whenever a
level changes (``logger.setLevel``, ``logging.basicConfig``, ``dictConfig``,
``logging.disable``), so that records nobody wants never cross into Python.
:func:`set_log_level` sets it explicitly, until the next change of a level.
"""

import atexit
import logging
import threading
from typing import Callable, Optional

from . import _native
from ._errors import InvalidArgumentError
from ._native import (
    LOCK_LOG_DEBUG,
    LOCK_LOG_ERROR,
    LOCK_LOG_INFO,
    LOCK_LOG_TRACE,
    LOCK_LOG_WARN,
    lib,
)

logger = logging.getLogger("redlease")

#: Python's level for the library's TRACE records (logging has no name for it).
TRACE = 5

#: The C log levels and their Python levels.
PYTHON_LEVELS = {
    LOCK_LOG_ERROR: logging.ERROR,
    LOCK_LOG_WARN: logging.WARNING,
    LOCK_LOG_INFO: logging.INFO,
    LOCK_LOG_DEBUG: logging.DEBUG,
    LOCK_LOG_TRACE: TRACE,
}

_state_lock = threading.Lock()


def _forward(level: int, target: Optional[bytes], message: Optional[bytes], _user_data: object) -> None:
    """The C callback. Runs on whichever thread logs (renewal threads, or a thread inside a
    call into the library), holding the GIL only for its own run. It must never raise: an
    exception cannot cross back into the library (ctypes would print and drop it)."""
    try:
        py_level = PYTHON_LEVELS.get(level, logging.WARNING)
        if not logger.isEnabledFor(py_level):
            return
        _name_this_thread()
        text = message.decode("utf-8", "replace") if message else ""
        where = target.decode("utf-8", "replace") if target else "redlease"
        _in_callback.active = True
        try:
            logger.log(py_level, "%s", text, extra={"redlease_target": where})
        finally:
            _in_callback.active = False
    except BaseException:  # noqa: BLE001 - nothing may leave a ctypes callback
        pass


def _name_this_thread() -> None:
    """Gives a library thread's Python face (``Dummy-N``) the thread's own name
    (``redlease-renew``, ...), once, so that ``%(threadName)s`` says which it is."""
    thread = threading.current_thread()
    if not isinstance(thread, threading._DummyThread) or getattr(thread, "_redlease_named", False):
        return
    thread._redlease_named = True  # type: ignore[attr-defined]
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", encoding="utf-8") as f:
            name = f.read().strip()
    except OSError:
        return
    if name:
        thread.name = name


# One C callback for the life of the process (ctypes must keep it alive).
_callback = _native.LOG_CALLBACK(_forward)


def _c_level(level: int) -> int:
    """The C level that sends every record at or above Python ``level``."""
    if level <= TRACE:
        return LOCK_LOG_TRACE
    if level <= logging.DEBUG:
        return LOCK_LOG_DEBUG
    if level <= logging.INFO:
        return LOCK_LOG_INFO
    if level <= logging.WARNING:
        return LOCK_LOG_WARN
    return LOCK_LOG_ERROR


def set_log_level(level: Optional[int]) -> None:
    """Sets which of the library's records reach the ``redlease`` logger: those at Python
    ``level`` (``logging.DEBUG``, ``logging.INFO``, ...) or more severe; ``None`` sends none.
    The logger's own level and handlers then filter as usual. By default it follows the
    logger's effective level (set at import and at every change of a level); this call
    overrides it until the next change. Not from a handler of a library record (that
    raises :class:`InvalidArgumentError`; a ``setLevel`` there is applied just after)."""
    global _applied
    if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
        raise InvalidArgumentError(
            f"level must be an int (a logging level) or None, not {type(level).__name__}"
        )
    with _state_lock:
        _apply(level)
        _applied = None  # the next change of a level applies again


def _apply(level: Optional[int]) -> None:
    """Gives the library ``level``. The caller holds ``_state_lock``."""
    if level is None:
        _native.check(lib.lock_set_log_callback(LOCK_LOG_WARN, _native.LOG_CALLBACK(), None))
    else:
        _native.check(lib.lock_set_log_callback(_c_level(level), _callback, None))


# The level last given to the library by following the logger (None: set by hand since, or
# never), whether following has stopped (at exit), and whether a level change waits for
# the worker thread. All under _state_lock.
_applied: Optional[int] = None
_stopped = False
_pending = False
# Set on a thread while it runs a library record through logging (see _forward).
_in_callback = threading.local()


def _effective() -> int:
    """The ``redlease`` logger's effective level, with what ``logging.disable`` turned off
    (above CRITICAL: nothing)."""
    level = logger.getEffectiveLevel()
    disabled = logging.root.manager.disable
    return disabled + 1 if disabled >= level else level


def _follow() -> None:
    """Gives the library the ``redlease`` logger's effective level, when it changed. Under
    ``_state_lock`` from the reading to the recording, so that concurrent changes end with
    the last one applied."""
    global _applied
    with _state_lock:
        if _stopped:
            return
        level = _effective()
        if level == _applied:
            return
        _apply(level if level <= logging.CRITICAL else None)
        _applied = level


def _follow_soon() -> None:
    """Has :func:`_follow` run on a worker thread (one at a time; changes made meanwhile
    are picked up by the same worker)."""
    global _pending
    with _state_lock:
        if _pending or _stopped:
            _pending = _pending or not _stopped
            return
        _pending = True

    def work() -> None:
        global _pending
        while True:
            with _state_lock:
                if not _pending:
                    return
                _pending = False
            try:
                _follow()
            except Exception:  # noqa: BLE001 - a level the library refused: nothing to tell
                pass

    try:
        threading.Thread(target=work, name="redlease-log-level", daemon=True).start()
    except RuntimeError:  # no thread now: the next change tries again
        with _state_lock:
            _pending = False


def _follow_level_changes() -> None:
    """Runs :func:`_follow` after every change of a logging level. ``Logger.setLevel`` and
    ``logging.disable`` clear the logging manager's level cache: its ``_clear_cache`` is
    wrapped. The library's level is set at once, unless this thread holds logging's lock
    (``dictConfig`` does while it configures) or is handling a library record: setting the
    level waits for the records in flight, which may be waiting for that lock, and is
    refused from inside a record. A worker thread sets it then."""
    manager = logging.Logger.manager
    original: Optional[Callable[[], None]] = getattr(manager, "_clear_cache", None)
    if original is None or getattr(original, "_redlease", False):
        return
    lock = getattr(logging, "_lock", None)

    def clear_cache_and_follow() -> None:
        original()
        try:
            holds_logging_lock = lock is None or lock._is_owned()  # type: ignore[union-attr]
        except AttributeError:
            holds_logging_lock = True
        if holds_logging_lock or getattr(_in_callback, "active", False):
            _follow_soon()
        else:
            try:
                _follow()
            except Exception:  # noqa: BLE001 - a level change must not fail setLevel
                _follow_soon()

    clear_cache_and_follow._redlease = True  # type: ignore[attr-defined]
    manager._clear_cache = clear_cache_and_follow  # type: ignore[method-assign]


def _stop_at_exit() -> None:
    # Library threads must not call into an interpreter that is shutting down.
    global _stopped
    try:
        with _state_lock:
            _stopped = True
            _apply(None)
    except Exception:  # noqa: BLE001 - at exit, nothing to report it to
        pass


_follow()
_follow_level_changes()
atexit.register(_stop_at_exit)
