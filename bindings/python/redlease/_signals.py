"""Ctrl-C during a blocked acquire: :class:`SignalCatcher` lets Python's signal handlers run
while the library blocks in a C call, and keeps what they raise for after the call.

Only the main thread runs Python's signal handlers, so only an acquire there needs one
(:func:`on_main_thread`).
"""

import ctypes
import signal
import threading
from ctypes import c_int
from types import FrameType
from typing import Any, Callable, List, Optional, Tuple

from . import _native

# PyErr_CheckSignals runs Python's signal handlers (on the main thread only). Called through
# ctypes.pythonapi, which keeps the GIL. Missing where there is no C API (PyPy): a blocked
# acquire then cannot be interrupted.
_check_signals: Optional[Callable[[], int]] = None
if hasattr(ctypes, "pythonapi"):
    _pyerr_check_signals = ctypes.pythonapi.PyErr_CheckSignals
    _pyerr_check_signals.restype = c_int
    _pyerr_check_signals.argtypes = []
    _check_signals = _pyerr_check_signals

_SIGNALS = sorted(signal.valid_signals()) if hasattr(signal, "valid_signals") else []
SignalHandler = Callable[[int, Optional[FrameType]], Any]


class SignalCatcher:
    """Lets signals interrupt a blocked acquire on the main thread: the acquire's
    ``on_interrupt``, and the signal handlers in force during the C call.

    The library calls :meth:`on_interrupt` on the acquiring thread when a signal interrupts
    the wait, and at least every 200 ms while it blocks. It runs Python's signal handlers;
    when one raises (``KeyboardInterrupt`` for Ctrl-C), the exception is kept, the acquire is
    cancelled, and the exception is raised once the C call has returned. A handler that
    returns (a signal not meant to stop anything) lets the wait go on.

    An exception must never leave a ctypes callback: ctypes would print and drop it, and
    hand the library an undefined return value. Catching it inside the callback is not
    enough, because the interpreter also runs pending signal handlers on entry to every
    Python function, before any ``try`` in it. So while the C call runs, every Python-level
    signal handler is replaced by a wrapper that runs it and keeps what it raised, and the
    originals are put back afterwards (unless a handler replaced them meanwhile).
    """

    def __init__(self) -> None:
        self.exception: Optional[BaseException] = None
        self.callback = _native.INTERRUPT_CALLBACK(self._on_interrupt)
        self._installed: List[Tuple[int, SignalHandler, SignalHandler]] = []

    def _on_interrupt(self, _user_data: object) -> int:
        try:
            if self.exception is None and _check_signals is not None:
                _check_signals()
        except BaseException as exc:  # noqa: BLE001 - an async exception; raised after the call
            self._keep(exc)
        return 1 if self.exception is not None else 0

    def _keep(self, exc: BaseException) -> None:
        if self.exception is None:
            self.exception = exc

    def _wrap(self, handler: SignalHandler) -> SignalHandler:
        def run_handler(signum: int, frame: Optional[FrameType]) -> None:
            try:
                handler(signum, frame)
            except BaseException as exc:  # noqa: BLE001 - raised after the C call
                self._keep(exc)

        return run_handler

    def install(self) -> bool:
        """Wraps the Python-level signal handlers; False when there are none (nothing can
        interrupt the wait, so no ``on_interrupt`` is needed)."""
        for signum in _SIGNALS:
            handler = signal.getsignal(signum)
            if not callable(handler):
                continue  # SIG_DFL, SIG_IGN, or a handler installed from C
            wrapper = self._wrap(handler)
            try:
                signal.signal(signum, wrapper)
            except (OSError, ValueError):  # not settable here (another interpreter, ...)
                continue
            self._installed.append((signum, handler, wrapper))
        return bool(self._installed)

    def uninstall(self) -> None:
        """Puts the original handlers back, unless a handler replaced them meanwhile."""
        while self._installed:
            signum, handler, wrapper = self._installed.pop()
            if signal.getsignal(signum) is wrapper:
                signal.signal(signum, handler)

    def take(self) -> Optional[BaseException]:
        """What a signal handler raised during the call, if anything (once)."""
        exc, self.exception = self.exception, None
        return exc


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
