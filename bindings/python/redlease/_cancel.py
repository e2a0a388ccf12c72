"""Ending blocked acquires on purpose: :class:`CancelToken` and :func:`cancel_all`."""

import threading
from ctypes import byref
from typing import Optional, Type

from . import _native
from ._errors import InvalidHandleError
from ._native import lib

# Mirrors the library's cancel_all flag for the waits that happen in Python (a thread
# waiting for another thread's holding of the same Lock object). Set by cancel_all() of this
# module only; a C caller's lock_cancel_all reaches such a thread when it calls the library.
# A plain bool, not an Event: a signal handler may set it while this thread is in reset.
_all_cancelled = False


class CancelToken:
    """Cancels the blocked acquires it is given to (``client.lock(..., cancel=token)``,
    ``client.acquire(..., cancel=token)``). Thread-safe.

    :meth:`cancel` makes every acquire given this token that is waiting, or starts to wait
    later, raise :class:`LockCancelledError` promptly, holding nothing. A cancelled token
    stays cancelled. Free it with :meth:`close` (or a ``with`` block); a token that is
    garbage-collected is freed too.
    """

    def __init__(self) -> None:
        self._handle = 0
        self._cancelled = False
        self._close_lock = threading.Lock()
        out = _native.lock_cancel_t()
        _native.check(lib.lock_cancel_new(byref(out)))
        self._handle = out.value

    def cancel(self) -> None:
        """Cancels the acquires waiting with this token, now and later. Does not block.

        Raises :class:`InvalidHandleError` once the token is closed."""
        handle = self.handle
        self._cancelled = True
        _native.check(lib.lock_cancel(handle))

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancelled

    @property
    def handle(self) -> int:
        """The C handle (``lock_cancel_t``). Raises :class:`InvalidHandleError` once closed."""
        handle = self._handle
        if not handle:
            raise InvalidHandleError("the cancel token is closed")
        return handle

    def close(self) -> None:
        """Frees the C handle; acquires already using it are not affected. Idempotent."""
        with self._close_lock:
            handle, self._handle = self._handle, 0
        if handle:
            _native.check(lib.lock_cancel_free(handle))

    def __enter__(self) -> "CancelToken":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: object, tb: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Not through close(): a finaliser may run while this thread holds _close_lock.
        handle, self._handle = getattr(self, "_handle", 0), 0
        try:
            if handle:
                lib.lock_cancel_free(handle)
        except Exception:  # noqa: BLE001 - never raise from a finaliser (interpreter exit)
            pass

    def __repr__(self) -> str:
        state = "closed" if not self._handle else "cancelled" if self._cancelled else "armed"
        return f"<redlease.CancelToken {state}>"


def cancel_all() -> None:
    """For shutting down: makes every acquire of this process that waits (``wait`` > 0), in
    progress or started later, raise :class:`LockCancelledError` promptly, until
    :func:`reset_cancel_all`. Single attempts (``wait=0``) are not affected. Does not block;
    a signal handler may call it."""
    global _all_cancelled
    _all_cancelled = True
    _native.check(lib.lock_cancel_all())


def reset_cancel_all() -> None:
    """Undoes :func:`cancel_all` for acquires started from now on."""
    global _all_cancelled
    _native.check(lib.lock_cancel_reset())
    _all_cancelled = False


def is_cancelled(token: Optional[CancelToken]) -> bool:
    """Whether a wait with ``token`` must end (the token, or :func:`cancel_all`)."""
    return _all_cancelled or (token is not None and token.cancelled)
