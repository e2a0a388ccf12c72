"""One lock over several names: :meth:`Client.lock_all` (``lock_acquire_all``).

All or none: the library takes the names in one global order (by Cluster slot, then by
key), the names one script can reach (one server, one slot) in one step, so callers wanting
overlapping sets never deadlock, and gives back what it took when one cannot be
taken. Each name is an ordinary C handle with its own lease, renewal and fencing token; a
loss of any name is the loss of the whole lock.
"""

import logging
import os
import threading
import weakref
from ctypes import byref, c_bool, c_char_p, c_uint64
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Type

from . import _args, _native, _registry
from ._cancel import CancelToken
from ._errors import LOCK_NOT_HELD, InvalidArgumentError, InvalidHandleError, LockNotHeldError
from ._native import lib
from ._registry import _REGISTRY, on_lost_from_c
from ._signals import SignalCatcher, on_main_thread

if TYPE_CHECKING:
    from ._client import Client

log = logging.getLogger("redlease")


class MultiLock:
    """A lock over several names, made by :meth:`Client.lock_all`: all of them or none.
    ``acquire()`` (or a ``with`` block) takes every name, waiting up to ``wait`` seconds in
    all (0: try once; ``None``: as long as it takes), without the GIL; Ctrl-C on the main
    thread and ``cancel`` end the wait, holding nothing. ``fencing_tokens`` gives each
    name's token; ``lost`` is set when any name is lost (the whole lock is then lost);
    ``release()`` releases every name. One holding at a time; not reentrant."""

    def __init__(
        self,
        client: "Client",
        names: Sequence[_args.Key],
        ttl: float,
        wait: Optional[float],
        *,
        renew: bool = True,
        on_lost: Optional[Callable[["MultiLock", str], None]] = None,
        cancel: Optional[CancelToken] = None,
    ) -> None:
        self._handles: List[int] = []
        if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
            raise InvalidArgumentError("names must be a sequence of str or bytes")
        self._keys = [_args.key_bytes(n) for n in names]
        self._client = client
        self._ttl_ms = _args.duration_ms(ttl, "ttl")
        self._wait_ms = _args.wait_ms(wait)
        _args.hold_options(renew, on_lost, cancel, CancelToken)
        self._renew, self._on_lost, self._cancel = renew, on_lost, cancel
        self._pid = os.getpid()
        self._fences: Dict[str, int] = {}
        self._gate = threading.Lock()
        #: Set (from a renewal thread) when any name is lost.
        self.lost = threading.Event()
        #: ``"not_held"`` or ``"unreachable"`` once lost.
        self.lost_reason: Optional[str] = None

    @property
    def names(self) -> List[str]:
        """The names, as given."""
        return [k.decode("utf-8") for k in self._keys]

    def acquire(self) -> "MultiLock":
        """Takes every name (see the class); returns self. Raises as
        :meth:`Lock.acquire`, for the first name that could not be taken (the others given
        back); :class:`InvalidArgumentError` for no names, a repeated or bad name, before
        anything is sent, or when this object is already held."""
        if not self._gate.acquire(blocking=False):
            raise InvalidArgumentError("this lock_all is already held; release it first")
        try:
            self._take()
        except BaseException:
            self._gate.release()
            raise
        return self

    def _take(self) -> None:
        n = len(self._keys)
        names = (c_char_p * max(n, 1))(*self._keys)
        out = (_native.lock_t * max(n, 1))()
        opts = _native.acquire_options()
        opts.renew = self._renew
        opts.on_lost = on_lost_from_c
        if self._cancel is not None:
            opts.cancel = self._cancel.handle
        catcher = SignalCatcher() if self._wait_ms and on_main_thread() else None
        _registry.adopting_begin()
        try:
            status = None
            try:
                if catcher is not None and catcher.install():
                    opts.on_interrupt = catcher.callback
                if catcher is None or catcher.exception is None:
                    status = lib.lock_acquire_all(
                        self._client.handle, names, n, self._ttl_ms, self._wait_ms, byref(opts), out
                    )
            finally:
                if catcher is not None:
                    catcher.uninstall()
            handles = [out[i] for i in range(n)] if status == 0 else []
            interrupted = catcher.take() if catcher is not None else None
            if interrupted is not None:
                for h in handles:
                    lib.lock_release(h)
                raise interrupted
            assert status is not None
            _native.check(status)
            fences: Dict[str, int] = {}
            for key, h in zip(self._keys, handles):
                fence = c_uint64()
                lib.lock_fencing_token(h, byref(fence))
                fences[key.decode("utf-8")] = fence.value
            ref: "weakref.ref[_registry.Holder]" = weakref.ref(self)
            with _REGISTRY:
                self._handles, self._fences = handles, fences
                self.lost_reason = None
                self.lost.clear()
                for h in handles:
                    _registry.register(h, ref)
                early = [_registry.take_early_loss(h) for h in handles]
        finally:
            _registry.adopting_end()
        for h, why in zip(handles, early):
            if why is not None:
                self._lost(h, why)

    def _lost(self, handle: int, reason: str) -> None:
        """A name was lost: the whole lock is (told once). Never raises."""
        try:
            with _REGISTRY:
                if handle not in self._handles or self.lost_reason is not None:
                    return
                self.lost_reason = reason
                self.lost.set()
            if self._on_lost is not None:
                self._on_lost(self, reason)
        except Exception:  # noqa: BLE001
            log.exception("redlease: the on_lost handler raised")

    def release(self) -> bool:
        """Releases every name. True when each was held without a break up to its
        release; False when any had been lost (every name is released all the same).
        Raises :class:`InvalidHandleError` when not held, and connection or server errors
        (after trying every name)."""
        with _REGISTRY:
            handles, self._handles = self._handles, []
        if not handles:
            raise InvalidHandleError("this lock_all is not held")
        ok, error = True, None
        try:
            for h in reversed(handles):
                status = lib.lock_release(h)
                with _REGISTRY:
                    _registry.forget(h)
                if status == LOCK_NOT_HELD:
                    ok = False
                elif status != 0 and error is None:
                    try:
                        _native.check(status)
                    except Exception as e:  # noqa: BLE001 - raised after every name
                        error = e
        finally:
            self._gate.release()
        if error is not None:
            raise error
        return ok and self.lost_reason is None

    @property
    def fencing_tokens(self) -> Dict[str, int]:
        """Each name's fencing token (of the current or last holding)."""
        return dict(self._fences)

    @property
    def held(self) -> bool:
        """Every name held, by the local view. Sends nothing."""
        handles = self._handles
        if not handles or self.lost_reason is not None:
            return False
        for h in handles:
            out = c_bool()
            if lib.lock_is_held(h, byref(out)) != 0 or not out.value:
                return False
        return True

    def __enter__(self) -> "MultiLock":
        return self.acquire()

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: object, tb: object) -> None:
        released = self.release()
        if exc_type is None and not released:
            raise LockNotHeldError(
                f"lock_all {self.names} was lost before the end of the with block "
                f"({self.lost_reason or 'not_held'}): the block ran partly unprotected",
                LOCK_NOT_HELD,
            )

    def __del__(self) -> None:
        handles = getattr(self, "_handles", [])
        try:
            if handles and self._pid == os.getpid():
                self._handles = []
                for h in handles:
                    lib.lock_release(h)
                    _registry.forget(h)
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        return f"<redlease.MultiLock {self.names} held={self.held}>"
