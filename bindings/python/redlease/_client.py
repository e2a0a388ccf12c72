"""Client and Lock: thin wrappers over the C ABI.

No lock logic lives here: the library decides who holds a lock. This module converts
arguments, keeps the bookkeeping that ties a Python object to its C handle, and makes that
bookkeeping safe for threads and signals.
"""

import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
import weakref
from ctypes import c_char_p, byref, c_bool, c_int, c_uint64
from types import FrameType
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

from . import _args, _kinds, _native
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
from ._native import LOCK_TOKEN_MAX, UINT64_MAX, lib

if TYPE_CHECKING:
    from ._async import AsyncLock

log = logging.getLogger("redlease")

LostHandler = Callable[["Lock", str], None]

#: Reasons given to ``on_lost`` handlers and kept in :attr:`Lock.lost_reason`.
LOST_REASONS = {_native.LOCK_LOST_NOT_HELD: "not_held", _native.LOCK_LOST_UNREACHABLE: "unreachable"}

# The bookkeeping of held locks. _LIVE maps each held C handle to its Lock (weakly: a Lock
# dropped while held is collected, and released, at once), for the one lost-lock callback
# shared by all locks. _EARLY_LOSS keeps losses reported before their handle was registered,
# while an acquire may yet register it (_ADOPTING counts those between their C call and their
# registration; when none is left, nothing can claim what is kept). _REGISTRY guards them
# and the handle fields of every Lock. Never call the library or user code while holding it
# (the library's lost-lock callback takes it). It is reentrant because a collection may run
# a finaliser while this thread holds it (a user's that closes a client); the library's own
# finalisers do not take it.
_LIVE: Dict[int, "weakref.ref[Lock]"] = {}
_EARLY_LOSS: Dict[int, str] = {}
_ADOPTING = [0]
_REGISTRY = threading.RLock()

# How often a thread waiting for another thread's holding of the same Lock object checks
# whether its wait was cancelled.
_GATE_SLICE = 0.05


def _lost_from_c(handle: int, reason: int, _user_data: object) -> None:
    why = LOST_REASONS.get(reason, "unknown")
    with _REGISTRY:
        ref = _LIVE.get(handle)
        lk = ref() if ref is not None else None
        if lk is None and _ADOPTING[0]:
            _EARLY_LOSS[handle] = why
    if lk is not None:
        lk._lost(handle, why)


@contextlib.contextmanager
def _adopting() -> Iterator[None]:
    """Marks an acquire between its C call and its registration: a loss reported for its
    handle meanwhile is kept for it."""
    with _REGISTRY:
        _ADOPTING[0] += 1
    try:
        yield
    finally:
        with _REGISTRY:
            _ADOPTING[0] -= 1
            if not _ADOPTING[0]:
                _EARLY_LOSS.clear()  # late reports for handles nobody will register


# One C callback for every lock (kept alive for the life of the module).
_on_lost_from_c = _native.LOST_CALLBACK(_lost_from_c)

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


class _SignalCatcher:
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


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _client_options(
    connect_timeout: Optional[float],
    io_timeout: Optional[float],
    pool_size: Optional[int],
    pool_wait: Optional[float],
    key_prefix: Optional[str],
    owner_label: Optional[str],
    tls_ca_cert_file: "Optional[Union[str, os.PathLike[str]]]",
) -> "_native.ClientOptions":
    """The C client options. The structure keeps the encoded strings alive while it lives."""
    opts = _native.client_options()
    if connect_timeout is not None:
        opts.connect_timeout_ms = _args.duration_ms(connect_timeout, "connect_timeout")
    if io_timeout is not None:
        opts.io_timeout_ms = _args.duration_ms(io_timeout, "io_timeout")
    if pool_wait is not None:
        opts.pool_wait_ms = _args.duration_ms(pool_wait, "pool_wait")
    if pool_size is not None:
        opts.pool_size = _args.positive_int(pool_size, "pool_size", 2**32)
    opts.key_prefix = _args.opt_str(key_prefix, "key_prefix")
    opts.owner_label = _args.opt_str(owner_label, "owner_label")
    opts.tls_ca_cert_file = _args.opt_path(tls_ca_cert_file, "tls_ca_cert_file")
    return opts


class Client:
    """A connection to one Redis server that hands out locks. Thread-safe.

    ``url``: ``redis://[user:pass@]host[:port][/db]``, ``rediss://...`` (TLS) or
    ``redis+unix:///path?db=N&user=U&pass=P``. Timeouts are seconds. Nothing connects until
    the first lock is taken. Use as a context manager, or call :meth:`close`.

    Options: ``connect_timeout`` and ``io_timeout`` (default 2 s each), ``pool_size``
    (connections the calling threads may use at once, and waiters that may block on the
    server at once; default 32), ``pool_wait`` (longest wait for a pooled connection;
    0 does not wait; default 2 s), ``key_prefix`` (put before every key), ``owner_label``
    (appended to tokens; default host/pid), ``tls_ca_cert_file`` (a PEM CA for ``rediss://``).

    Raises :class:`InvalidArgumentError` for a bad URL or option.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: Optional[float] = None,
        io_timeout: Optional[float] = None,
        pool_size: Optional[int] = None,
        pool_wait: Optional[float] = None,
        key_prefix: Optional[str] = None,
        owner_label: Optional[str] = None,
        tls_ca_cert_file: "Optional[Union[str, os.PathLike[str]]]" = None,
    ) -> None:
        self._handle = 0
        self._url = "?"
        self._pid = os.getpid()
        self._close_lock = threading.RLock()
        if not isinstance(url, str):
            raise InvalidArgumentError(f"url must be a str, not {type(url).__name__}")
        url_bytes = _args.utf8(url, "url")
        opts = _client_options(
            connect_timeout, io_timeout, pool_size, pool_wait, key_prefix, owner_label, tls_ca_cert_file
        )
        handle = _native.lock_client_t()
        _native.check(lib.lock_client_open_opts(url_bytes, byref(opts), byref(handle)))
        self._handle = handle.value
        self._url = _native.read_string(lib.lock_client_url, self._handle)

    @classmethod
    def redlock(
        cls,
        urls: "Sequence[str]",
        *,
        connect_timeout: Optional[float] = None,
        io_timeout: Optional[float] = None,
        pool_size: Optional[int] = None,
        pool_wait: Optional[float] = None,
        key_prefix: Optional[str] = None,
        owner_label: Optional[str] = None,
        tls_ca_cert_file: "Optional[Union[str, os.PathLike[str]]]" = None,
    ) -> "Client":
        """A client whose locks are taken on a majority of the independent primaries
        ``urls`` (1 to 15 single-server or Sentinel URLs), in parallel (Redlock). Its locks
        have no fencing token (``fencing_token`` is 0): see the README for what Redlock
        promises and what it cannot. Options as for :class:`Client`.

        Raises :class:`InvalidArgumentError` for no URL, more than 15, a bad, Cluster or
        duplicate URL, or a bad option."""
        if isinstance(urls, (str, bytes)) or not all(isinstance(u, str) for u in urls):
            raise InvalidArgumentError("urls must be a sequence of str")
        encoded = [_args.utf8(u, "url") for u in urls]
        opts = _client_options(
            connect_timeout, io_timeout, pool_size, pool_wait, key_prefix, owner_label, tls_ca_cert_file
        )
        array = (c_char_p * max(len(encoded), 1))(*encoded)
        handle = _native.lock_client_t()
        _native.check(lib.lock_client_open_redlock(array, len(encoded), byref(opts), byref(handle)))
        client = cls.__new__(cls)
        client._handle = handle.value
        client._pid = os.getpid()
        client._close_lock = threading.RLock()
        client._url = _native.read_string(lib.lock_client_url, client._handle, 16384)
        return client


    @property
    def url(self) -> str:
        """The URL with any password replaced by ``***``."""
        return self._url

    def lock(
        self,
        key: Key,
        ttl: float = 30.0,
        wait: Optional[float] = None,
        *,
        renew: bool = True,
        on_lost: Optional[LostHandler] = None,
        cancel: Optional[CancelToken] = None,
        min_replicas: Optional[Tuple[int, float]] = None,
        reentrant: bool = False,
        owner: Optional[str] = None,
    ) -> "Lock":
        """A lock on ``key``, not yet acquired: use it in a ``with`` block (which acquires,
        waiting up to ``wait`` seconds, or as long as it takes for ``None``) or call
        :meth:`Lock.acquire`. ``ttl`` is the lease in seconds (at least 0.01), renewed every
        ttl/3 while held unless ``renew`` is false. ``on_lost(lock, reason)`` runs on the
        renewal thread if the lock is lost. ``cancel.cancel()`` ends a blocked acquire.
        ``min_replicas=(n, timeout_seconds)``: ``n`` replicas must acknowledge the acquire
        and every extend (``WAIT``); too few roll the acquire back (:class:`ReplicationError`).
        ``reentrant=True``: the thread that holds it may acquire it again (see
        :class:`Lock`); ``owner="..."`` makes that owner, not the thread, the one that may
        (unique on every host: include a UUID).

        Does not block. Raises :class:`InvalidArgumentError` for a bad argument."""
        return Lock(
            self,
            key,
            ttl,
            wait,
            renew=renew,
            on_lost=on_lost,
            cancel=cancel,
            min_replicas=min_replicas,
            reentrant=reentrant,
            owner=owner,
        )

    def acquire(
        self,
        key: Key,
        ttl: float = 30.0,
        wait: Optional[float] = None,
        *,
        renew: bool = True,
        on_lost: Optional[LostHandler] = None,
        cancel: Optional[CancelToken] = None,
        min_replicas: Optional[Tuple[int, float]] = None,
        reentrant: bool = False,
        owner: Optional[str] = None,
    ) -> "Lock":
        """Acquires ``key`` and returns the held :class:`Lock`. Blocks up to ``wait`` seconds
        (0: try once; ``None``: as long as it takes) without holding the GIL; Ctrl-C on the
        main thread interrupts it, and ``cancel.cancel()`` from another thread ends it.

        Raises :class:`LockBusyError` when still held by another owner at the end,
        :class:`LockCancelledError` when cancelled, ``KeyboardInterrupt`` on Ctrl-C (nothing
        is held after any of these), :class:`InvalidArgumentError` for a bad argument
        (``ttl`` under 0.01 s, a key beginning with ``redlease:``, ...),
        :class:`RedisConnectionError` or :class:`RedisServerError`. With ``reentrant=True``
        each call from the thread (or ``owner``) that holds ``key`` returns a new
        :class:`Lock` with one more hold, at once; the key is released with the last."""
        return self.lock(
            key,
            ttl,
            wait,
            renew=renew,
            on_lost=on_lost,
            cancel=cancel,
            min_replicas=min_replicas,
            reentrant=reentrant,
            owner=owner,
        ).acquire()

    def lock_async(
        self,
        key: Key,
        ttl: float = 30.0,
        wait: Optional[float] = None,
        *,
        renew: bool = True,
        on_lost: Optional[LostHandler] = None,
        min_replicas: Optional[Tuple[int, float]] = None,
    ) -> "AsyncLock":
        """The asyncio face of :meth:`lock`: ``async with client.lock_async(key) as lk:``.
        The blocking calls run in worker threads, and cancelling the task ends a blocked
        acquire. Does not block."""
        from ._async import AsyncLock

        return AsyncLock(self.lock(key, ttl, wait, renew=renew, on_lost=on_lost, min_replicas=min_replicas))

    async def acquire_async(
        self,
        key: Key,
        ttl: float = 30.0,
        wait: Optional[float] = None,
        *,
        renew: bool = True,
        on_lost: Optional[LostHandler] = None,
        min_replicas: Optional[Tuple[int, float]] = None,
    ) -> "AsyncLock":
        """The asyncio face of :meth:`acquire`: ``lk = await client.acquire_async(key)``.
        Waits in a worker thread; cancelling the task ends the wait (``CancelledError``,
        nothing held). Raises as :meth:`acquire`."""
        return await self.lock_async(
            key, ttl, wait, renew=renew, on_lost=on_lost, min_replicas=min_replicas
        ).acquire()

    def semaphore(self, name: Key, permits: int) -> "Semaphore":
        """The counting semaphore ``name``, which lets at most ``permits`` holders in at
        once: :meth:`Semaphore.acquire` takes a permit, a :class:`Lock` of its own (lease,
        renewal, lost signal, fencing token). Every user of one name should pass the same
        ``permits``. Not on a Redlock client (its acquires raise
        :class:`InvalidArgumentError`).

        Does not block. Raises :class:`InvalidArgumentError` for a bad name or a
        ``permits`` that is not an int from 0 to 2**32 - 1 (0 is refused by
        :meth:`Semaphore.acquire`)."""
        return Semaphore(self, name, permits)

    def rwlock(self, name: Key) -> "RwLock":
        """The read-write lock ``name``: many readers or one writer.
        :meth:`RwLock.read` and :meth:`RwLock.write` describe a hold, a :class:`Lock` to use
        in a ``with`` block or to :meth:`Lock.acquire`. Not on a Redlock client.

        Does not block. Raises :class:`InvalidArgumentError` for a bad name."""
        return RwLock(self, name)

    def is_locked(self, key: Key) -> bool:
        """Whether anyone holds ``key`` right now. Blocks for one round trip."""
        out = c_bool()
        _native.check(lib.lock_is_locked(self.handle, _args.key_bytes(key), byref(out)))
        return out.value

    def close(self) -> None:
        """Releases every lock still held from this client (blocking for those releases),
        then closes it. Idempotent. The Lock objects of those locks then say they are not
        held, and their ``release()`` raises :class:`InvalidHandleError`. An acquire still
        waiting on another thread waits on (a cancel ends it); if it is granted, it gives
        the lock back and raises :class:`InvalidHandleError`."""
        # Held throughout: a close racing this one returns once the locks are released.
        # Reentrant, for a finaliser that closes this client during the close.
        with self._close_lock:
            handle, self._handle = self._handle, 0
            if handle and self._pid == os.getpid():
                try:
                    _native.check(lib.lock_client_close(handle))
                finally:
                    self._forget_locks()

    def _forget_locks(self) -> None:
        """Drops this client's locks from the registry: the library reports no loss for a
        closed client's handles, and an entry kept for a Lock nobody touches again would
        live as long as the object."""
        with _REGISTRY:
            pass  # an _adopt that found this client open has registered its handle by now
        # Chosen from a copy, outside _REGISTRY: what allocates may run the collector, and
        # with it a Lock's finaliser, which calls the library and pops its own entry.
        mine = [h for h, ref in _LIVE.copy().items() if getattr(ref(), "_client", None) is self]
        with _REGISTRY:
            for handle in mine:
                _LIVE.pop(handle, None)  # handles are never reused: the entry is this one

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: object, tb: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Not through close(): a finaliser may run while this thread holds _close_lock.
        handle, self._handle = getattr(self, "_handle", 0), 0
        try:
            if handle and self._pid == os.getpid():
                lib.lock_client_close(handle)
        except Exception:  # noqa: BLE001 - never raise from a finaliser (interpreter exit)
            pass

    def __repr__(self) -> str:
        state = "open" if self._handle else "closed"
        return f"<redlease.Client {self._url!r} {state}>"

    @property
    def handle(self) -> int:
        """The C handle (for diagnostics). Raises :class:`InvalidHandleError` once closed."""
        handle = self._handle
        if not handle:
            raise InvalidHandleError("the client is closed")
        return handle


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

    def __init__(
        self,
        client: Client,
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
        self._handle = 0
        if not isinstance(reentrant, bool):
            raise InvalidArgumentError("reentrant must be a bool")
        if owner is not None and not reentrant:
            raise InvalidArgumentError("owner is for a reentrant lock: pass reentrant=True too")
        self._reentrant = reentrant
        # The owner's name as the library takes it (None: the thread that acquires).
        if owner is not None and not isinstance(owner, str):
            raise InvalidArgumentError(f"owner must be a str, not {type(owner).__name__}")
        self._owner_name = None if owner is None else _args.utf8(owner, "owner")
        # Handles of the holds added by re-acquiring while held (a reentrant lock), last
        # on top; the first hold is _handle.
        self._reentries: List[int] = []
        self._client = client
        # What the object holds: a mutex, a permit, a side of a read-write lock (_kinds).
        self._kind = kind
        self._min_replicas = _args.min_replicas(min_replicas)
        self._key = _args.key_bytes(key)
        self._ttl_ms = _args.duration_ms(ttl, "ttl")
        self._wait_ms = _args.wait_ms(wait)
        if not isinstance(renew, bool):
            raise InvalidArgumentError("renew must be a bool")
        if on_lost is not None and not callable(on_lost):
            raise InvalidArgumentError("on_lost must be callable")
        if cancel is not None and not isinstance(cancel, CancelToken):
            raise InvalidArgumentError("cancel must be a redlease.CancelToken")
        self._renew = renew
        self._on_lost = on_lost
        self._cancel = cancel
        # Held from the start of an acquire to the end of its release: one holding at a time.
        self._gate = threading.Lock()
        # Who holds the gate: a thread id, or an asyncio task (see _acquire).
        self._owner: object = None
        self._pid = os.getpid()
        # The handle of the current (or last) holding, for losses reported late.
        self._last_handle = 0
        self._fencing_token: Optional[int] = None
        self._token: Optional[str] = None
        self._lost_event: Optional[threading.Event] = None
        # The current holding was made by acquire() and may be taken over by a with block
        # (only the owner reads or sets it).
        self._with_may_take_over = False
        #: ``"not_held"`` or ``"unreachable"`` once the current (or last) holding is lost.
        self.lost_reason: Optional[str] = None

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

    def acquire(self, *, cancel: Optional[CancelToken] = None) -> "Lock":
        """Acquires the lock, waiting as configured; returns self. Blocks without the GIL,
        first while another thread holds this object, then while another owner holds the
        key. On the main thread, Ctrl-C interrupts the wait. ``cancel`` (or the object's
        token) ends the wait when cancelled from another thread.

        Raises :class:`LockBusyError` when the wait ended while another owner held it,
        :class:`LockCancelledError` when cancelled, ``KeyboardInterrupt`` (or any exception a
        signal handler raised) when interrupted; nothing is held after any of these.
        :class:`InvalidArgumentError` when this thread already holds it; connection and
        server errors as :meth:`Client.acquire`."""
        self._acquire(cancel or self._cancel, threading.get_ident())
        self._with_may_take_over = True
        return self

    def _acquire(self, cancel: Optional[CancelToken], owner: object) -> "Lock":
        """Acquires for ``owner`` (a thread id, or an asyncio task) with ``cancel``.

        An exception at any point, also an asynchronous one (what a signal handler raised)
        right after the C call returned, leaves nothing held: a handle written by the
        library is released again, and the gate is given back."""
        started = time.monotonic()
        if self._reentrant and self._handle and self._owner == owner:
            return self._reenter(cancel)
        self._enter_gate(started, cancel, owner)
        out = _native.lock_t()
        try:
            with _adopting():
                opts = self._options(cancel)
                opts.renew = self._renew
                opts.on_lost = _on_lost_from_c
                if self._min_replicas is not None:
                    opts.min_replicas, opts.min_replicas_timeout_ms = self._min_replicas
                if cancel is not None:
                    opts.cancel = cancel.handle
                wait_ms = self._wait_left(started)
                # Python runs signal handlers on the main thread only. `catcher` (and `opts`,
                # which refers to its callback) stay alive until the C call has returned.
                catcher = _SignalCatcher() if wait_ms and _on_main_thread() else None
                status = None
                try:
                    if catcher is not None and catcher.install():
                        opts.on_interrupt = catcher.callback
                    if catcher is None or catcher.exception is None:
                        client = self._client.handle
                        status = self._kind.take(
                            client, self._key, self._ttl_ms, wait_ms, byref(opts), byref(out)
                        )
                finally:
                    if catcher is not None:
                        catcher.uninstall()
                interrupted = catcher.take() if catcher is not None else None
                if interrupted is not None:
                    raise interrupted  # what a signal handler raised (KeyboardInterrupt) wins
                assert status is not None
                _native.check(status)
                fence = c_uint64()
                _native.check(lib.lock_fencing_token(out.value, byref(fence)))
                self._adopt(out.value, fence.value)
        except BaseException:
            if out.value:
                self._disown(out.value)
                lib.lock_release(out.value)
            self._owner = None
            self._gate.release()
            raise
        return self

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
        out = _native.lock_t()
        try:
            _native.check(
                self._kind.take(
                    self._client.handle, self._key, self._ttl_ms, self._wait_ms, byref(opts), byref(out)
                )
            )
            with _REGISTRY:
                self._reentries.append(out.value)
        except BaseException:
            if out.value and out.value not in self._reentries:
                lib.lock_release(out.value)
            raise
        return self

    def _enter_gate(self, started: float, cancel: Optional[CancelToken], owner: object) -> None:
        """Takes the gate: waits, within the object's ``wait``, while another thread's
        holding of this object lasts."""
        if self._gate.acquire(blocking=False):
            self._owner = owner
            return
        if self._owner == owner:
            raise InvalidArgumentError(
                f"this Lock on {self.key!r} is already acquired here; release it first"
            )
        while True:
            if self._wait_ms and is_cancelled(cancel):
                raise LockCancelledError(f"the wait for {self._what} was cancelled")
            slice_s = _GATE_SLICE
            if self._wait_ms != UINT64_MAX:
                left = started + self._wait_ms / 1000 - time.monotonic()
                if left <= 0:
                    raise LockBusyError(
                        f"{self._what} is held by another thread through this Lock object"
                    )
                slice_s = min(slice_s, left)
            if self._gate.acquire(timeout=slice_s):
                self._owner = owner
                return

    def _wait_left(self, started: float) -> int:
        """The object's wait minus the time spent waiting for the gate, in ms."""
        if self._wait_ms in (0, UINT64_MAX):
            return self._wait_ms
        spent_ms = int((time.monotonic() - started) * 1000)
        return max(self._wait_ms - spent_ms, 0)

    def _adopt(self, handle: int, fencing_token: int) -> None:
        """Records ``handle`` as the current holding. Raises :class:`InvalidHandleError`,
        recording nothing, when the client was closed since the library granted it (the
        close may have missed it: the caller releases it)."""
        ref = weakref.ref(self)
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
                _LIVE[handle] = ref
            early = _EARLY_LOSS.pop(handle, None)
        if closed:
            raise InvalidHandleError("the client was closed during the acquire")
        if early is not None:
            self._lost(handle, early)

    def _disown(self, handle: int) -> None:
        """Forgets ``handle`` (released or about to be)."""
        with _REGISTRY:
            if self._handle == handle:
                self._handle = 0
            _LIVE.pop(handle, None)
            _EARLY_LOSS.pop(handle, None)

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
            self._disown(handle)
            self._with_may_take_over = False
            self._owner = None
            self._gate.release()
        if status == LOCK_NOT_HELD:
            return False
        _native.check(status)
        return True

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
                    f"({self.lost_reason or 'expired'}): the block ran partly unprotected",
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
                self._what, self.lost_reason or "expired", exc_type.__name__,
            )

    def __del__(self) -> None:
        # Release a lock dropped while held; a forked child's copy is never released (the
        # library refuses it anyway). No _REGISTRY here: this thread may be holding it.
        handle = getattr(self, "_handle", 0)
        try:
            if handle and self._pid == os.getpid():
                for extra in reversed(self._reentries):
                    lib.lock_release(extra)
                self._reentries = []
                self._handle = 0
                lib.lock_release(handle)
                _LIVE.pop(handle, None)
                _EARLY_LOSS.pop(handle, None)
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

    def __init__(self, client: Client, name: Key, permits: int) -> None:
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

    def __init__(self, client: Client, name: Key) -> None:
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

