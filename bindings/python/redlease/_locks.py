"""The lock objects: :class:`Lock` (a mutex, a semaphore's permit, or a hold of a read-write
lock), and :class:`Semaphore` and :class:`RwLock`, which make the Locks of their kind.

No lock logic lives here: the library decides who holds a lock. A Lock converts its
arguments, calls the library, and keeps the bookkeeping that ties it to its C handle (in
the registry, ``_registry``), safe for threads and signals (``_signals``).
"""

import logging
import os
import threading
import time
import weakref
from ctypes import byref, c_bool, c_uint64
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple, Type, Union

from . import _args, _kinds, _native, _registry
from ._args import Key
from ._cancel import CancelToken, is_cancelled
from ._errors import (
    LOCK_NOT_HELD,
    InvalidArgumentError,
    InvalidHandleError,
    LockBusyError,
    LockCancelledError,
    LockNotHeldError,
)
from ._kinds import MUTEX, Kind
from ._native import LOCK_TOKEN_MAX, UINT64_MAX, lib, lock_t
from ._registry import _REGISTRY, LOST_REASONS, on_lost_from_c
from ._signals import SignalCatcher, on_main_thread

log = logging.getLogger("redlease")

LostHandler = Callable[["Lock", str], None]

# How often a thread waiting for another thread's holding of the same Lock object checks
# whether its wait was cancelled.
_GATE_SLICE = 0.05


class LockClient(Protocol):
    """What a Lock needs of the :class:`~redlease.Client` that made it: its C handle
    (``handle`` raises :class:`InvalidHandleError` once it is closed), and ``_handle``, 0
    once it is closed. Structural, so that this module need not import ``_client``, which
    imports it."""

    _handle: int

    @property
    def handle(self) -> int: ...


_SHARED_OPTIONS: Dict[bool, "_native.AcquireOptions"] = {}


def _shared_options(renew: bool) -> "_native.AcquireOptions":
    """The options of a plain (not reentrant, no replicas) acquire, renewed or not: one
    struct per process for each, which the library only reads."""
    opts = _SHARED_OPTIONS.get(renew)
    if opts is None:
        opts = _native.acquire_options()
        opts.renew = renew
        opts.on_lost = on_lost_from_c
        opts = _SHARED_OPTIONS.setdefault(renew, opts)
    return opts


def _wait_left(started: float, wait_ms: int) -> int:
    """A wait of ``wait_ms`` begun at ``started``, minus the time spent since, in ms."""
    if wait_ms in (0, UINT64_MAX):
        return wait_ms
    spent_ms = int((time.monotonic() - started) * 1000)
    return max(wait_ms - spent_ms, 0)


_UNSET = object()


def _threading_wait_ms(blocking: object, timeout: object) -> int:
    """The wait of ``acquire(blocking, timeout)`` called as :meth:`threading.Lock.acquire`
    is: ``blocking=False`` tries once; ``timeout`` -1 waits as long as it takes."""
    if blocking is _UNSET:
        blocking = True
    if timeout is _UNSET:
        timeout = -1
    blocking = bool(blocking)  # any truth value, as threading.Lock.acquire takes
    if timeout == -1 and not isinstance(timeout, bool):
        return UINT64_MAX if blocking else 0
    if not blocking:
        raise InvalidArgumentError("can't specify a timeout for a non-blocking call")
    return _args.wait_ms(timeout)


class Lock:
    """A lock on one key. Created by :meth:`Client.lock` (not acquired) or
    :meth:`Client.acquire` (held); also a permit of a semaphore
    (:meth:`Semaphore.acquire`, held) and a hold of a read-write lock (:meth:`RwLock.read`
    and :meth:`RwLock.write`, not acquired), which behave the same in every other way.

    Thread-safe, with the semantics of :class:`threading.Lock`: the object has at most one
    holding at a time. While one thread holds it, another thread's :meth:`acquire` (or
    ``with lk:``) waits, within the object's ``wait``, until it is released, then acquires
    with its own fresh C handle. :meth:`release` releases the current holding, whichever
    thread made it. Acquiring again from the thread that holds it raises
    :class:`InvalidArgumentError` (it would wait for itself).

    With ``reentrant=True`` (a mutex only) the object is like :class:`threading.RLock`:
    the thread that holds it may acquire it again (``with lk:`` inside ``with lk:``), each
    acquire adding a hold at once and each :meth:`release` giving one back, the key being
    released with the last; another thread's :meth:`release` raises
    :class:`LockNotHeldError` and changes nothing. Every hold shares one lease, one renewal
    and the first hold's fencing token, on the server too: :meth:`Client.acquire` with
    ``reentrant=True`` from the same thread, on any Lock object of the same client or
    another, adds a hold rather than waiting. With ``owner="..."`` the holds belong to that
    owner instead of the thread: any thread, process or host acquiring with it adds one.

    A ``with`` block acquires on entry and releases on exit; on a Lock this thread has just
    acquired with :meth:`acquire` (``with client.acquire(key) as lk:``,
    ``with sem.acquire() as permit:``) it takes that holding over instead, and releases it
    on exit. Leaving the block normally when the lock was lost meanwhile raises
    :class:`LockNotHeldError`, because the block ran (partly) unprotected; when the block
    raised, its exception goes through unchanged and a failed release is logged to the
    ``redlease`` logger. A Lock garbage-collected while held is released.
    """

    #: Set on the locks of the redis-py compatible lock: dropped while held (collected, in
    #: a reference cycle too, or at interpreter exit) they are abandoned, not released.
    _abandon_when_dropped = False

    # Defaults of the per-holding fields, read from the class until first set (an acquire
    # of a plain lock then assigns only what it changes).
    _handle = 0
    # Who holds the gate: a thread id, or an asyncio task (see _acquire).
    _owner: object = None
    # The process that made the current holding (set with it: see _adopt and __del__).
    _pid = 0
    # The handle of the current (or last) holding, for losses reported late.
    _last_handle = 0
    _fencing_token: Optional[int] = None
    _token: Optional[str] = None
    _lost_event: Optional[threading.Event] = None
    # Handles of the holds added by re-acquiring while held (a reentrant lock), last on top;
    # the first hold is _handle. A list of its own once there is one.
    _reentries: "Union[List[int], Tuple[()]]" = ()
    # The options every acquire passes, made by the first (see _acquire_options).
    _base_opts: Optional[_native.AcquireOptions] = None
    # The current holding was made by acquire() and may be taken over by a with block
    # (only the owner reads or sets it).
    _with_may_take_over = False
    # A weak reference to this object, for the registry: made by the first acquire.
    _ref: "Optional[weakref.ref[Lock]]" = None
    #: ``"not_held"`` or ``"unreachable"`` once the current (or last) holding is lost.
    lost_reason: Optional[str] = None

    def __init__(
        self,
        client: LockClient,
        key: Key,
        ttl: float,
        wait: Optional[float],
        *,
        renew: bool = True,
        on_lost: Optional[LostHandler] = None,
        cancel: Optional[CancelToken] = None,
        min_replicas: Optional[Tuple[int, float]] = None,
        kind: Kind = MUTEX,
        reentrant: bool = False,
        owner: Optional[str] = None,
    ) -> None:
        if reentrant is not False:
            if not isinstance(reentrant, bool):
                raise InvalidArgumentError("reentrant must be a bool")
        elif owner is not None:
            raise InvalidArgumentError("owner is for a reentrant lock: pass reentrant=True too")
        self._reentrant = reentrant
        # The owner's name as the library takes it (None: the thread that acquires).
        if owner is not None and not isinstance(owner, str):
            raise InvalidArgumentError(f"owner must be a str, not {type(owner).__name__}")
        self._owner_name = None if owner is None else _args.utf8(owner, "owner")
        self._client = client
        # What the object holds: a mutex, a permit, a side of a read-write lock (_kinds).
        self._kind = kind
        self._min_replicas = None if min_replicas is None else _args.min_replicas(min_replicas)
        self._key = _args.key_bytes(key)
        self._ttl_ms = _args.duration_ms(ttl, "ttl")
        self._wait_ms = _args.wait_ms(wait)
        if renew is not True or on_lost is not None or cancel is not None:
            _args.hold_options(renew, on_lost, cancel, CancelToken)
        self._renew = renew
        self._on_lost = on_lost
        self._cancel = cancel
        # Held from the start of an acquire to the end of its release: one holding at a time.
        self._gate = threading.Lock()

    @property
    def lost(self) -> threading.Event:
        """An event set (from the renewal thread) when the current holding is lost; a worker
        can wait on it or check it. Cleared by the next acquire."""
        with _REGISTRY:
            if self._lost_event is None:
                self._lost_event = threading.Event()
                if self.lost_reason is not None:
                    self._lost_event.set()
            return self._lost_event

    def _lost(self, handle: int, reason: str) -> None:
        """Records the loss of holding ``handle`` (once) and calls ``on_lost``. Runs on the
        renewal thread, or on a thread whose extend found the lock gone; never raises."""
        try:
            with _REGISTRY:
                if handle != self._last_handle or self.lost_reason is not None:
                    return  # an earlier holding of this object, or already reported
                self.lost_reason = reason
                if self._lost_event is not None:
                    self._lost_event.set()
            if self._on_lost is not None:
                self._on_lost(self, reason)
        except Exception:  # noqa: BLE001
            log.exception("redlease: the on_lost handler raised")

    def acquire(
        self,
        blocking: object = _UNSET,
        timeout: object = _UNSET,
        *,
        cancel: Optional[CancelToken] = None,
    ) -> "Union[Lock, bool]":
        """Acquires the lock, waiting as configured; returns self. Blocks without the GIL,
        first while another thread holds this object, then while another owner holds the
        key. On the main thread, Ctrl-C interrupts the wait. ``cancel`` (or the object's
        token) ends the wait when cancelled from another thread.

        Raises :class:`LockBusyError` when the wait ended while another owner held it,
        :class:`LockCancelledError` when cancelled, ``KeyboardInterrupt`` (or any exception a
        signal handler raised) when interrupted; nothing is held after any of these.
        :class:`InvalidArgumentError` when this thread already holds it; connection and
        server errors as :meth:`Client.acquire`.

        Called with ``blocking`` or ``timeout`` (as :meth:`threading.Lock.acquire`), it
        returns ``True`` when acquired and ``False`` when the wait ended with the lock held
        elsewhere (or, with ``blocking=False``, held by this thread): ``blocking=False``
        tries once, ``timeout`` seconds replaces the object's wait (-1, the default: as
        long as it takes). Other errors raise as above."""
        if blocking is _UNSET and timeout is _UNSET:
            self._acquire(cancel or self._cancel, threading.get_ident())
            self._with_may_take_over = True
            return self
        wait_ms = _threading_wait_ms(blocking, timeout)
        owner = threading.get_ident()
        if wait_ms == 0 and self._owner == owner and self._handle and not self._reentrant:
            return False  # threading.Lock: a non-blocking acquire of a lock this thread holds
        try:
            self._acquire(cancel or self._cancel, owner, wait_ms)
        except LockBusyError:
            return False
        self._with_may_take_over = True
        return True

    def _take_over(self, token: str) -> "Lock":
        """Adopts the lock held under ``token`` (``lock_adopt``); see :meth:`Client.adopt`."""
        if not isinstance(token, str):
            raise InvalidArgumentError(f"token must be a str, not {type(token).__name__}")
        token_bytes = _args.utf8(token, "token")

        def adopt(client: int, key: bytes, ttl_ms: int, _wait: int, opts: Any, out: Any) -> int:
            return int(lib.lock_adopt(client, key, token_bytes, ttl_ms, opts, out))

        self._acquire(None, threading.get_ident(), 0, adopt)
        self._with_may_take_over = True
        return self

    def locked(self) -> bool:
        """Whether anyone holds the name right now (this object or any other owner; for a
        semaphore, any permit; for a read-write lock, the writer or a reader), as the
        server says: one round trip. :meth:`owned` says whether this object holds it."""
        return self._client.is_locked(self._key)

    def owned(self) -> bool:
        """Whether this object holds the lock, by the local view (:attr:`held`): acquired,
        not released, not lost, lease not ended. Sends nothing."""
        return self.held

    def _acquire(
        self,
        cancel: Optional[CancelToken],
        owner: object,
        wait_ms: Optional[int] = None,
        take: Optional[_kinds.Take] = None,
    ) -> "Lock":
        """Acquires for ``owner`` (a thread id, or an asyncio task) with ``cancel``, waiting
        ``wait_ms`` (the object's wait when None), through ``take`` (the kind's C call when
        None; ``lock_adopt`` for :meth:`Client.adopt`).

        An exception at any point, also an asynchronous one (what a signal handler raised)
        right after the C call returned, leaves nothing held: a handle written by the
        library is released again, and the gate is given back."""
        if wait_ms is None:
            wait_ms = self._wait_ms
        started = time.monotonic() if wait_ms else 0.0
        if self._reentrant and self._handle and self._owner == owner:
            return self._reenter(cancel)
        if self._gate.acquire(blocking=False):
            self._owner = owner
        else:
            self._enter_gate(started, cancel, owner, wait_ms)
        out = lock_t()
        _registry.adopting_begin()
        try:
            if wait_ms:
                wait_ms = _wait_left(started, wait_ms)
            client = self._client.handle
            if take is None:
                take = self._kind.take
            if wait_ms and on_main_thread():
                # Python runs signal handlers on the main thread only.
                status = self._take_interruptibly(take, client, cancel, wait_ms, out)
            else:
                opts = self._base_opts
                if opts is None or cancel is not None:
                    opts = self._acquire_options(cancel, False)
                status = take(client, self._key, self._ttl_ms, wait_ms, byref(opts), byref(out))
            if status:
                _native.check(status)
            fence = c_uint64()
            status = lib.lock_fencing_token(out.value, byref(fence))
            if status:
                _native.check(status)
            self._adopt(out.value, fence.value)
        except BaseException:
            if out.value:
                self._disown(out.value)
                lib.lock_release(out.value)
            self._owner = None
            self._gate.release()
            raise
        finally:
            _registry.adopting_end()
        return self

    def _take_interruptibly(
        self, take: _kinds.Take, client: int, cancel: Optional[CancelToken], wait_ms: int, out: Any
    ) -> int:
        """``take`` on the main thread, where signals interrupt the wait: returns its status,
        or raises what a signal handler raised during it (``KeyboardInterrupt``), after the
        C call has returned (``out`` may hold a handle then: the caller releases it)."""
        # `catcher` (and `opts`, which refers to its callback) stay alive until the C call
        # has returned.
        catcher = SignalCatcher()
        opts = self._acquire_options(cancel, True)
        status = None
        try:
            if catcher.install():
                opts.on_interrupt = catcher.callback
            if catcher.exception is None:
                status = take(client, self._key, self._ttl_ms, wait_ms, byref(opts), byref(out))
        finally:
            catcher.uninstall()
        interrupted = catcher.take()
        if interrupted is not None:
            raise interrupted  # what a signal handler raised (KeyboardInterrupt) wins
        assert status is not None
        return status

    def _acquire_options(self, cancel: Optional[CancelToken], interruptible: bool) -> "_native.AcquireOptions":
        """The options of an acquire of this object: built once (and shared with every
        plain lock of the process), passed as they are when there is nothing to cancel or
        interrupt, else copied. The library only reads them; the copy refers to the same
        strings and callbacks, which the object (or this module) keeps alive."""
        base = self._base_opts
        if base is None and self._min_replicas is None and not self._reentrant:
            # The common options, made once per process and shared read-only by every lock.
            base = self._base_opts = _shared_options(self._renew)
        if base is None:
            base = self._options(None)
            base.renew = self._renew
            base.on_lost = on_lost_from_c
            if self._min_replicas is not None:
                base.min_replicas, base.min_replicas_timeout_ms = self._min_replicas
            self._base_opts = base
        if cancel is None and not interruptible:
            return base
        opts = _native.AcquireOptions.from_buffer_copy(base)
        if cancel is not None:
            opts.cancel = cancel.handle
        return opts

    def _options(self, cancel: Optional[CancelToken]) -> "_native.AcquireOptions":
        """The acquire options every acquire of this object passes."""
        opts = _native.acquire_options()
        opts.reentrant = self._reentrant
        opts.owner = self._owner_name
        return opts

    def _reenter(self, cancel: Optional[CancelToken]) -> "Lock":
        """One more hold of the reentrant lock this thread holds through this object:
        returns at once (the library finds its owner holding it)."""
        opts = self._options(cancel)
        opts.renew = self._renew
        if cancel is not None:
            opts.cancel = cancel.handle
        out = lock_t()
        try:
            _native.check(
                self._kind.take(
                    self._client.handle, self._key, self._ttl_ms, self._wait_ms, byref(opts), byref(out)
                )
            )
            with _REGISTRY:
                self._reentries = [*self._reentries, out.value]
        except BaseException:
            if out.value and out.value not in self._reentries:
                lib.lock_release(out.value)
            raise
        return self

    def _enter_gate(
        self, started: float, cancel: Optional[CancelToken], owner: object, wait_ms: int
    ) -> None:
        """Takes the gate: waits, within ``wait_ms``, while another thread's holding of this
        object lasts."""
        if self._gate.acquire(blocking=False):
            self._owner = owner
            return
        if self._owner == owner:
            raise InvalidArgumentError(
                f"this Lock on {self.key!r} is already acquired here; release it first"
            )
        while True:
            if wait_ms and is_cancelled(cancel):
                raise LockCancelledError(f"the wait for {self._what} was cancelled")
            slice_s = _GATE_SLICE
            if wait_ms != UINT64_MAX:
                left = started + wait_ms / 1000 - time.monotonic()
                if left <= 0:
                    raise LockBusyError(
                        f"{self._what} is held by another thread through this Lock object"
                    )
                slice_s = min(slice_s, left)
            if self._gate.acquire(timeout=slice_s):
                self._owner = owner
                return

    def _adopt(self, handle: int, fencing_token: int) -> None:
        """Records ``handle`` as the current holding. Raises :class:`InvalidHandleError`,
        recording nothing, when the client was closed since the library granted it (the
        close may have missed it: the caller releases it)."""
        ref = self._ref
        if ref is None:
            ref = self._ref = weakref.ref(self)
        with _REGISTRY:
            # Close marks the client closed before it releases, and forgets the registered
            # handles after: one of the two sees this handle.
            closed = not self._client._handle
            if not closed:
                self._handle = self._last_handle = handle
                self._pid = os.getpid()
                self._fencing_token = fencing_token
                self._token = None
                self._with_may_take_over = False
                self.lost_reason = None
                if self._lost_event is not None:
                    self._lost_event.clear()
                _registry.register(handle, ref)
            early = _registry.take_early_loss(handle)
        if closed:
            raise InvalidHandleError("the client was closed during the acquire")
        if early is not None:
            self._lost(handle, early)

    def _disown(self, handle: int) -> None:
        """Forgets ``handle`` (released or about to be)."""
        with _REGISTRY:
            if self._handle == handle:
                self._handle = 0
            _registry.forget(handle)

    def release(self) -> bool:
        """Stops renewal and releases the current holding. Blocks for one round trip.
        Returns True when the lock was held without a break up to the release, False when
        it had already been lost or had run out of lease (part of the work may have run
        unprotected; the key is deleted all the same if it still holds the token). The
        holding is over either way: another thread waiting for this object goes ahead.

        A reentrant lock gives back its latest hold; the key is released with the last.

        Raises :class:`InvalidHandleError` when the object is not held (never acquired,
        already released, or its client was closed), :class:`LockNotHeldError` when another
        thread holds a reentrant lock (nothing changes), and connection or server errors
        when Redis could not be told (the lock then expires after its ttl)."""
        if self._reentrant and self._handle:
            if self._owner_name is None and self._owner != threading.get_ident():
                raise LockNotHeldError(
                    f"{self._what} is held by another thread: only it may release it", LOCK_NOT_HELD
                )
            with _REGISTRY:
                extra = self._reentries.pop() if self._reentries else 0
            if extra:
                status = lib.lock_release(extra)
                if status == LOCK_NOT_HELD:
                    return False
                _native.check(status)
                return True
        with _REGISTRY:
            handle, self._handle = self._handle, 0
        if not handle:
            raise InvalidHandleError(f"this Lock on {self.key!r} is not held")
        try:
            status = lib.lock_release(handle)
        finally:
            _registry.forget(handle)  # after the release: a loss reported during it is told
            self._with_may_take_over = False
            self._owner = None
            self._gate.release()
        if status == LOCK_NOT_HELD:
            return False
        _native.check(status)
        return True

    def _abandon(self) -> None:
        """Lets go of the current holding without releasing it (``lock_abandon``): renewal
        stops, nothing is sent, and the key keeps the token until its lease ends. For the
        redis-py compatible lock, whose forgotten locks must outlive their object as
        redis-py's do. Does nothing when not held."""
        with _REGISTRY:
            handle, self._handle = self._handle, 0
        if not handle:
            return
        try:
            if self._pid == os.getpid():  # a forked child's copy is the parent's lock
                lib.lock_abandon(handle)
        finally:
            self._disown(handle)
            self._with_may_take_over = False
            self._owner = None
            self._gate.release()

    def extend(self, ttl: float) -> None:
        """Sets the lease of the current holding to ``ttl`` seconds from now. Blocks for one
        round trip, cut off when the current lease ends. Raises :class:`LockNotHeldError`
        when the lock was lost (also when the extend was not confirmed before the lease
        ended: a loss is final), :class:`InvalidHandleError` when not held."""
        ttl_ms = _args.duration_ms(ttl, "ttl")
        handle = self._handle
        status = lib.lock_extend(handle, ttl_ms)
        if status == LOCK_NOT_HELD and handle:
            # The library reports this loss through the lost-lock callback as well; this
            # makes sure it is recorded even if that callback was cut short by a signal.
            self._lost(handle, LOST_REASONS[1])
        _native.check(status)

    @property
    def held(self) -> bool:
        """The local view: acquired, not released, not lost, lease not ended. Sends nothing."""
        handle = self._handle
        if not handle:
            return False
        out = c_bool()
        return lib.lock_is_held(handle, byref(out)) == 0 and out.value

    @property
    def fencing_token(self) -> int:
        """Larger than that of every earlier acquisition of this key: pass it to the storage,
        which should reject older tokens. 0 before the lock is first acquired."""
        return self._fencing_token or 0

    @property
    def token(self) -> str:
        """The value stored under the key while held. Read from the library on first use:
        raises :class:`InvalidHandleError` when first read after the release."""
        token = self._token
        if token is None:
            token = self._token = _native.read_string(lib.lock_token, self._handle, LOCK_TOKEN_MAX)
        return token

    @property
    def key(self) -> str:
        """The lock name (without the client's key prefix)."""
        return self._key.decode("utf-8")

    @property
    def _what(self) -> str:
        """What the object holds, for messages: ``lock 'x'``, ``semaphore 'x'``, ..."""
        return self._kind.describe(self.key)

    @property
    def remaining(self) -> float:
        """Seconds of lease left by the local clock; 0.0 once lost or released."""
        handle = self._handle
        out = c_uint64()
        if not handle or lib.lock_remaining_ms(handle, byref(out)) != 0:
            return 0.0
        return out.value / 1000.0

    def __enter__(self) -> "Lock":
        if self._with_may_take_over and self._owner == threading.get_ident() and not self._reentries:
            # `with client.acquire(key) as lk:`: the block takes over the holding this
            # thread has just made, and releases it on exit.
            self._with_may_take_over = False
            return self
        return self._acquire(self._cancel, threading.get_ident())

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: object, tb: object) -> None:
        if exc_type is None:
            if not self.release():
                raise LockNotHeldError(
                    f"{self._what} was lost before the end of the with block "
                    f"({self.lost_reason or 'not_held'}): the block ran partly unprotected",
                    LOCK_NOT_HELD,
                )
            return
        # The block raised: its exception goes through, whatever happens to the release.
        try:
            released = self.release()
        except Exception:  # noqa: BLE001 - logged; the block's exception is what matters
            log.warning(
                "redlease: releasing %s at the end of a with block that raised %s failed",
                self._what, exc_type.__name__, exc_info=True,
            )
            return
        if not released:
            log.warning(
                "redlease: %s was lost (%s) before the end of a with block that raised %s",
                self._what, self.lost_reason or "not_held", exc_type.__name__,
            )

    def __del__(self) -> None:
        # Release a lock dropped while held (abandon it, for the redis-py compatible lock:
        # see _abandon); a forked child's copy is never released (the library refuses it
        # anyway). No _REGISTRY here: this thread may be holding it.
        handle = getattr(self, "_handle", 0)
        try:
            if handle and self._pid == os.getpid():
                for extra in reversed(self._reentries):
                    lib.lock_release(extra)
                self._reentries = ()
                self._handle = 0
                if self._abandon_when_dropped:
                    lib.lock_abandon(handle)
                else:
                    lib.lock_release(handle)
                _registry.forget(handle)
        except Exception:  # noqa: BLE001 - never raise from a finaliser (interpreter exit)
            pass

    def __repr__(self) -> str:
        handle = self._handle
        what = repr(self.key) if self._kind is MUTEX else self._what
        if not handle:
            return f"<redlease.Lock {what} not held>"
        return f"<redlease.Lock {what} held={self.held} handle={handle:#x}>"


class Semaphore:
    """A counting semaphore: at most ``permits`` holders of ``name`` at once, on every host.
    Made by :meth:`Client.semaphore`; holds nothing itself and may be shared by threads::

        with client.semaphore("api:partner", 5).acquire(ttl=10.0, wait=30.0) as permit:
            call_the_api(fencing_token=permit.fencing_token)

    A permit is a :class:`Lock` with a lease of its own, renewed while held; a crashed
    holder's permit frees itself after its ttl (by the server's clock). A release wakes one
    waiter, which then tries again (no order among waiters)."""

    def __init__(self, client: LockClient, name: Key, permits: int) -> None:
        self._client = client
        self._name = _args.key_bytes(name)
        self._permits = _args.uint32(permits, "permits")
        self._kind = _kinds.permit(self._permits)

    @property
    def name(self) -> str:
        """The semaphore's name (without the client's key prefix)."""
        return self._name.decode("utf-8")

    @property
    def permits(self) -> int:
        """How many holders it lets in at once."""
        return self._permits

    def acquire(
        self,
        ttl: float = 30.0,
        wait: Optional[float] = None,
        *,
        renew: bool = True,
        on_lost: Optional[LostHandler] = None,
        cancel: Optional[CancelToken] = None,
        min_replicas: Optional[Tuple[int, float]] = None,
    ) -> Lock:
        """Takes a permit and returns it, held: a :class:`Lock` (``release()``, ``extend()``,
        ``held``, ``fencing_token``, ``token``, ``remaining``, ``lost``; a ``with`` block on
        it releases it at the end). The arguments are those of :meth:`Client.acquire`, and
        so is the blocking: up to ``wait`` seconds (0: try once; ``None``: as long as it
        takes) without the GIL, Ctrl-C and ``cancel`` end it.

        Raises :class:`LockBusyError` when no permit was free when the wait ended,
        :class:`InvalidArgumentError` for ``permits`` 0 or a Redlock client,
        :class:`RedisServerError` when the name is in use by another kind of lock (a mutex
        or a read-write lock), and otherwise as :meth:`Client.acquire`."""
        return Lock(
            self._client, self._name, ttl, wait, renew=renew, on_lost=on_lost, cancel=cancel,
            min_replicas=min_replicas, kind=self._kind,
        ).acquire()

    def __repr__(self) -> str:
        return f"<redlease.Semaphore {self.name!r} permits={self._permits}>"


class RwLock:
    """A read-write lock: many readers or one writer, on every host. Made by
    :meth:`Client.rwlock`; holds nothing itself and may be shared by threads::

        rw = client.rwlock("catalog")
        with rw.read(ttl=10.0, wait=5.0) as reading:    # shared with other readers
            ...
        with rw.write(ttl=10.0, wait=5.0) as writing:   # exclusive
            ...

    A waiting writer keeps new readers out, so a stream of readers cannot starve it. Each
    hold is a :class:`Lock` with its own lease (renewed), lost signal and fencing token."""

    def __init__(self, client: LockClient, name: Key) -> None:
        self._client = client
        self._name = _args.key_bytes(name)

    @property
    def name(self) -> str:
        """The read-write lock's name (without the client's key prefix)."""
        return self._name.decode("utf-8")

    def read(
        self,
        ttl: float = 30.0,
        wait: Optional[float] = None,
        *,
        renew: bool = True,
        on_lost: Optional[LostHandler] = None,
        cancel: Optional[CancelToken] = None,
        min_replicas: Optional[Tuple[int, float]] = None,
    ) -> Lock:
        """A read hold, not yet acquired: a :class:`Lock` to use in a ``with`` block or to
        :meth:`Lock.acquire`, with the arguments of :meth:`Client.lock`. Its acquire raises
        :class:`LockBusyError` when a writer still held or waited when the wait ended, and
        :class:`RedisServerError` when the name is in use by another kind of lock.

        Does not block. Raises :class:`InvalidArgumentError` for a bad argument."""
        return Lock(
            self._client, self._name, ttl, wait, renew=renew, on_lost=on_lost, cancel=cancel,
            min_replicas=min_replicas, kind=_kinds.READ,
        )

    def write(
        self,
        ttl: float = 30.0,
        wait: Optional[float] = None,
        *,
        renew: bool = True,
        on_lost: Optional[LostHandler] = None,
        cancel: Optional[CancelToken] = None,
        min_replicas: Optional[Tuple[int, float]] = None,
    ) -> Lock:
        """The write hold, not yet acquired: as :meth:`read`, but exclusive. Its acquire
        raises :class:`LockBusyError` when a reader or another writer still held when the
        wait ended.

        Does not block. Raises :class:`InvalidArgumentError` for a bad argument."""
        return Lock(
            self._client, self._name, ttl, wait, renew=renew, on_lost=on_lost, cancel=cancel,
            min_replicas=min_replicas, kind=_kinds.WRITE,
        )

    def __repr__(self) -> str:
        return f"<redlease.RwLock {self.name!r}>"

