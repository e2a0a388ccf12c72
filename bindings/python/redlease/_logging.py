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
        logger.log(py_level, "%s", text, extra={"redlease_target": where})
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


def set_log_level(level: Optional[int], *, _following: bool = False) -> None:
    """Sets which of the library's records reach the ``redlease`` logger: those at Python
    ``level`` (``logging.DEBUG``, ``logging.INFO``, ...) or more severe; ``None`` sends none.
    The logger's own level and handlers then filter as usual. By default it follows the
    logger's effective level (set at import and at every change of a level); this call
    overrides it until the next change."""
    global _applied
    if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
        raise TypeError(f"level must be an int (a logging level) or None, not {type(level).__name__}")
    with _state_lock:
        if not _following:
            _applied = None  # the next change of a level applies again
        if level is None:
            _native.check(lib.lock_set_log_callback(LOCK_LOG_WARN, _native.LOG_CALLBACK(), None))
        else:
            _native.check(lib.lock_set_log_callback(_c_level(level), _callback, None))


_applied: Optional[int] = None
_stopped = False


def _follow() -> None:
    """Sets the library's level from the ``redlease`` logger's effective level (also what
    ``logging.disable`` turned off), when it changed."""
    global _applied
    if _stopped:
        return
    level = logger.getEffectiveLevel()
    disabled = logging.root.manager.disable
    if disabled >= level:
        level = disabled + 1
    with _state_lock:
        if level == _applied:
            return
        _applied = level
    set_log_level(level if level <= logging.CRITICAL else None, _following=True)


def _follow_level_changes() -> None:
    """Runs :func:`_follow` after every change of a logging level. ``Logger.setLevel`` and
    ``logging.disable`` clear the logging manager's level cache: its ``_clear_cache`` is
    wrapped. The library's level is set synchronously, unless this thread holds logging's
    lock (``dictConfig`` does while it configures): a log callback in flight on another
    thread may be waiting for that lock, while setting the level waits for the callbacks in
    flight; a short-lived thread sets it then."""
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
        if holds_logging_lock:
            threading.Thread(target=_follow, name="redlease-log-level", daemon=True).start()
        else:
            _follow()

    clear_cache_and_follow._redlease = True  # type: ignore[attr-defined]
    manager._clear_cache = clear_cache_and_follow  # type: ignore[method-assign]


def _stop_at_exit() -> None:
    # Library threads must not call into an interpreter that is shutting down.
    global _stopped
    _stopped = True
    try:
        set_log_level(None)
    except Exception:  # noqa: BLE001 - at exit, nothing to report it to
        pass


_follow()
_follow_level_changes()
atexit.register(_stop_at_exit)
