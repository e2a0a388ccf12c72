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
(``"redlease::renewal"``, ...). Which records the library sends at all is set by
:func:`set_log_level` (by default from the ``redlease`` logger's level when the package is
imported: warnings and errors, unless it was configured otherwise), so that records nobody
wants never cross into Python.
"""

import atexit
import logging
import threading
from typing import Optional

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
        text = message.decode("utf-8", "replace") if message else ""
        where = target.decode("utf-8", "replace") if target else "redlease"
        logger.log(py_level, "%s", text, extra={"redlease_target": where})
    except BaseException:  # noqa: BLE001 - nothing may leave a ctypes callback
        pass


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
    The logger's own level and handlers then filter as usual. At import it is set from the
    logger's effective level (``logging.WARNING`` unless configured before the import)."""
    if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
        raise TypeError(f"level must be an int (a logging level) or None, not {type(level).__name__}")
    with _state_lock:
        if level is None:
            _native.check(lib.lock_set_log_callback(LOCK_LOG_WARN, _native.LOG_CALLBACK(), None))
        else:
            _native.check(lib.lock_set_log_callback(_c_level(level), _callback, None))


def _stop_at_exit() -> None:
    # Library threads must not call into an interpreter that is shutting down.
    try:
        set_log_level(None)
    except Exception:  # noqa: BLE001 - at exit, nothing to report it to
        pass


set_log_level(logger.getEffectiveLevel())
atexit.register(_stop_at_exit)
