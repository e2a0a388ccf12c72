"""What an exiting process waits for: the give-backs the library sends in the background."""

import atexit
from ctypes import byref, c_bool
from typing import Optional

from . import _args, _native
from ._native import lib

#: How long the interpreter's exit waits, at most, for give-backs still in flight (see
#: :func:`wait_for_background_withdrawals`).
EXIT_WAIT_S = 5.0


def wait_for_background_withdrawals(timeout: Optional[float] = EXIT_WAIT_S) -> bool:
    """Waits up to ``timeout`` seconds (``None``: as long as it takes) for the give-backs
    this process sends in the background, and returns whether none is left.

    An acquire whose reply never came (lost, or late past the call's bound) gives back what
    it may have taken on a thread of its own, bounded by one I/O timeout, so that the call
    keeps its own bound. The interpreter's exit waits for them (up to :data:`EXIT_WAIT_S`),
    so a script that ends right after such a failure leaves no lock held until its ttl;
    call this yourself before ``os._exit``, which skips that. Blocks without the GIL;
    returns at once when nothing is in flight. Raises :class:`InvalidArgumentError` for a
    bad ``timeout``."""
    limit_ms = _args.wait_ms(timeout)
    done = c_bool()
    _native.check(lib.lock_wait_for_background_withdrawals(limit_ms, byref(done)))
    return done.value


def _at_exit() -> None:
    try:
        wait_for_background_withdrawals(EXIT_WAIT_S)
    except Exception:  # noqa: BLE001  (the library may be unloadable this late)
        pass


atexit.register(_at_exit)
