"""Client and Lock: thin wrappers over the C ABI (no lock logic lives here)."""

import logging
import math
import os
import threading
import weakref
from ctypes import byref, c_bool, c_uint64
from typing import Callable, Optional, Union

from . import _native
from ._errors import LOCK_NOT_HELD, InvalidArgumentError, InvalidHandleError, LockNotHeldError
from ._native import LOCK_TOKEN_MAX, UINT64_MAX, lib

log = logging.getLogger("redlease")

Key = Union[str, bytes]
LostHandler = Callable[["Lock", str], None]

#: Reasons given to ``on_lost`` handlers and kept in :attr:`Lock.lost_reason`.
LOST_REASONS = {1: "not_held", 2: "unreachable"}

# Held locks by C handle, for the one lost-lock callback shared by all of them. Weak
# references: a Lock dropped while held is collected (and released) at once.
_LIVE: "dict[int, weakref.ref[Lock]]" = {}
# Losses reported before their Lock was registered.
_EARLY_LOSS: "dict[int, str]" = {}
_LOSS_LOCK = threading.Lock()


def _lost_from_c(handle: int, reason: int, _user_data: object) -> None:
    why = LOST_REASONS.get(reason, "unknown")
    with _LOSS_LOCK:
        ref = _LIVE.get(handle)
        lk = ref() if ref is not None else None
        if lk is None:
            _EARLY_LOSS[handle] = why
    if lk is not None:
        lk._lost(why)


# One C callback for every lock (kept alive for the life of the module).
_on_lost_from_c = _native.LOST_CALLBACK(_lost_from_c)


def _key_bytes(key: Key) -> bytes:
    """A lock name as the UTF-8 bytes the C ABI takes. ``bytes`` must be valid UTF-8."""
    if isinstance(key, str):
        data = key.encode("utf-8", "surrogatepass")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgumentError("the key contains lone surrogates (not valid UTF-8)") from None
    elif isinstance(key, (bytes, bytearray, memoryview)):
        data = bytes(key)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgumentError("a bytes key must be valid UTF-8") from None
    else:
        raise InvalidArgumentError(f"the key must be str or bytes, not {type(key).__name__}")
    if not data:
        raise InvalidArgumentError("the key is empty")
    if b"\0" in data:
        raise InvalidArgumentError("the key contains a NUL character")
    return data


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{what} must be a number of seconds, not {type(value).__name__}")
    value = float(value)
    if math.isnan(value) or value < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative number of seconds, got {value}")
    return value


def _ttl_ms(ttl: object, what: str = "ttl") -> int:
    """A positive duration in whole milliseconds (at least 1 ms)."""
    seconds = _seconds(ttl, what)
    if math.isinf(seconds) or seconds * 1000 >= UINT64_MAX:
        raise InvalidArgumentError(f"{what} is too long: {seconds}")
    ms = int(seconds * 1000)
    if ms < 1:
        raise InvalidArgumentError(f"{what} must be at least 0.001 s, got {seconds}")
    return ms


def _wait_ms(wait: Optional[float]) -> int:
    """0: try once; None or inf: wait as long as it takes; otherwise milliseconds, rounded up."""
    if wait is None:
        return UINT64_MAX
    seconds = _seconds(wait, "wait")
    if math.isinf(seconds):
        return UINT64_MAX
    ms = math.ceil(seconds * 1000)
    if ms >= UINT64_MAX:
        raise InvalidArgumentError(f"wait is too long: {seconds}")
    return ms


def _opt_str(value: Optional[str], what: str) -> Optional[bytes]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a str")
    if "\0" in value:
        raise InvalidArgumentError(f"{what} contains a NUL character")
    return value.encode("utf-8")


class Client:
    """A connection to one Redis server that hands out locks. Thread-safe.

    ``url``: ``redis://[user:pass@]host[:port][/db]``, ``rediss://...`` (TLS) or
    ``redis+unix:///path?db=N&user=U&pass=P``. Timeouts are seconds. Nothing connects until
    the first lock is taken. Use as a context manager, or call :meth:`close`.
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
        tls_ca_cert_file: Optional[str] = None,
    ) -> None:
        self._handle = 0
        self._pid = os.getpid()
        if not isinstance(url, str):
            raise InvalidArgumentError(f"url must be a str, not {type(url).__name__}")
        opts = _native.ClientOptions()
        _native.check(lib.lock_client_options_init(byref(opts)))
        if connect_timeout is not None:
            opts.connect_timeout_ms = _ttl_ms(connect_timeout, "connect_timeout")
        if io_timeout is not None:
            opts.io_timeout_ms = _ttl_ms(io_timeout, "io_timeout")
        if pool_wait is not None:
            opts.pool_wait_ms = _wait_ms(_seconds(pool_wait, "pool_wait"))
        if pool_size is not None:
            if isinstance(pool_size, bool) or not isinstance(pool_size, int) or not 0 < pool_size < 2**32:
                raise InvalidArgumentError("pool_size must be a positive int")
            opts.pool_size = pool_size
        # Keep the encoded strings alive for the duration of the call.
        strings = [
            _opt_str(key_prefix, "key_prefix"),
            _opt_str(owner_label, "owner_label"),
            _opt_str(tls_ca_cert_file, "tls_ca_cert_file"),
        ]
        opts.key_prefix, opts.owner_label, opts.tls_ca_cert_file = strings
        handle = _native.lock_client_t()
        _native.check(lib.lock_client_open_opts(_opt_str(url, "url"), byref(opts), byref(handle)))
        self._handle = handle.value
        self._url = _native.read_string(lib.lock_client_url, self._handle)

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
    ) -> "Lock":
        """A lock on ``key``, not yet acquired: use it in a ``with`` block (which acquires,
        waiting up to ``wait`` seconds, or as long as it takes for ``None``) or call
        :meth:`Lock.acquire`. ``ttl`` is the lease in seconds, renewed every ttl/3 while
        held unless ``renew`` is false. ``on_lost(lock, reason)`` runs on the renewal
        thread if the lock is lost."""
        return Lock(self, key, ttl, wait, renew=renew, on_lost=on_lost)

    def acquire(
        self,
        key: Key,
        ttl: float = 30.0,
        wait: Optional[float] = None,
        *,
        renew: bool = True,
        on_lost: Optional[LostHandler] = None,
    ) -> "Lock":
        """Acquires ``key`` and returns the held :class:`Lock`. Blocks up to ``wait`` seconds
        (0: try once; ``None``: as long as it takes) without holding the GIL.

        Raises :class:`LockBusyError` when still held by another owner at the end."""
        lk = self.lock(key, ttl, wait, renew=renew, on_lost=on_lost)
        lk.acquire()
        return lk

    def is_locked(self, key: Key) -> bool:
        """Whether anyone holds ``key`` right now (one round trip)."""
        out = c_bool()
        _native.check(lib.lock_is_locked(self._handle, _key_bytes(key), byref(out)))
        return out.value

    def close(self) -> None:
        """Releases every lock still held from this client, then closes it. Idempotent."""
        handle, self._handle = self._handle, 0
        if handle and self._pid == os.getpid():
            _native.check(lib.lock_client_close(handle))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        state = "open" if self._handle else "closed"
        return f"<redlease.Client {getattr(self, '_url', '?')!r} {state}>"

    @property
    def handle(self) -> int:
        """The C handle (for diagnostics). Raises :class:`InvalidHandleError` once closed."""
        if not self._handle:
            raise InvalidHandleError("the client is closed")
        return self._handle


class Lock:
    """A lock on one key. Created by :meth:`Client.lock` (not acquired) or
    :meth:`Client.acquire` (held). Thread-safe.

    A ``with`` block acquires on entry and releases on exit; leaving the block normally
    when the lock was lost meanwhile raises :class:`LockNotHeldError`, because the block
    ran (partly) unprotected. A Lock garbage-collected while held is released.
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
    ) -> None:
        self._handle = 0
        self._client = client
        self._key = _key_bytes(key)
        self._ttl_ms = _ttl_ms(ttl)
        self._wait_ms = _wait_ms(wait)
        if not isinstance(renew, bool):
            raise InvalidArgumentError("renew must be a bool")
        if on_lost is not None and not callable(on_lost):
            raise InvalidArgumentError("on_lost must be callable")
        self._renew = renew
        self._on_lost = on_lost
        self._pid = os.getpid()
        self._released = False
        self._fencing_token: Optional[int] = None
        self._token: Optional[str] = None
        self._lost_event: Optional[threading.Event] = None
        #: ``"not_held"`` or ``"unreachable"`` once lost.
        self.lost_reason: Optional[str] = None

    @property
    def lost(self) -> threading.Event:
        """An event set (from the renewal thread) when the lock is lost; a worker can wait
        on it or check it."""
        with _LOSS_LOCK:
            if self._lost_event is None:
                self._lost_event = threading.Event()
                if self.lost_reason is not None:
                    self._lost_event.set()
            return self._lost_event

    def _lost(self, reason: str) -> None:
        # Runs on the renewal thread (ctypes holds the GIL); never let an exception out.
        try:
            with _LOSS_LOCK:
                self.lost_reason = reason
                if self._lost_event is not None:
                    self._lost_event.set()
            if self._on_lost is not None:
                self._on_lost(self, reason)
        except Exception:  # noqa: BLE001
            log.exception("redlease: the on_lost handler raised")

    def acquire(self) -> "Lock":
        """Acquires the lock, waiting as configured; returns self. Blocks without the GIL.

        Raises :class:`LockBusyError` when the wait ended while another owner held it."""
        if self._handle and not self._released:
            raise InvalidArgumentError("this Lock is already acquired; release it first")
        opts = _native.AcquireOptions(self._renew, _on_lost_from_c, None)
        handle = _native.lock_t()
        self.lost_reason = None
        self._fencing_token = self._token = None
        if self._lost_event is not None:
            self._lost_event.clear()
        _native.check(
            lib.lock_acquire_opts(
                self._client.handle, self._key, self._ttl_ms, self._wait_ms, byref(opts), byref(handle)
            )
        )
        self._handle = handle.value
        self._released = False
        self._pid = os.getpid()
        fence = c_uint64()
        _native.check(lib.lock_fencing_token(self._handle, byref(fence)))
        self._fencing_token = fence.value
        with _LOSS_LOCK:
            _LIVE[self._handle] = weakref.ref(self)
            early = _EARLY_LOSS.pop(self._handle, None)
        if early is not None:
            self._lost(early)
        return self

    def release(self) -> bool:
        """Stops renewal and releases the lock. Returns True when released, False when it had
        already been lost (expired or taken: part of the work ran unprotected).

        Raises :class:`InvalidHandleError` for a lock already released, and connection or
        server errors when Redis could not be told (the lock then expires after its ttl)."""
        status = lib.lock_release(self._handle)
        self._released = True
        _LIVE.pop(self._handle, None)
        if status == LOCK_NOT_HELD:
            return False
        _native.check(status)
        return True

    def extend(self, ttl: float) -> None:
        """Sets the lease to ``ttl`` seconds from now. Raises :class:`LockNotHeldError` when
        the lock was lost."""
        _native.check(lib.lock_extend(self._handle, _ttl_ms(ttl)))

    @property
    def held(self) -> bool:
        """The local view: acquired, not released, not lost, lease not ended. Sends nothing."""
        if not self._handle:
            return False
        out = c_bool()
        status = lib.lock_is_held(self._handle, byref(out))
        return status == 0 and out.value

    @property
    def fencing_token(self) -> int:
        """Larger than that of every earlier acquisition of this key: pass it to the storage,
        which should reject older tokens. 0 before the lock is acquired."""
        return self._fencing_token or 0

    @property
    def token(self) -> str:
        """The value stored under the key while held. Read from the library on first use:
        raises :class:`InvalidHandleError` when first read after the release."""
        if self._token is None:
            self._token = _native.read_string(lib.lock_token, self._handle, LOCK_TOKEN_MAX)
        return self._token

    @property
    def key(self) -> str:
        return self._key.decode("utf-8")

    @property
    def remaining(self) -> float:
        """Seconds of lease left by the local clock; 0.0 once lost or released."""
        out = c_uint64()
        if not self._handle or lib.lock_remaining_ms(self._handle, byref(out)) != 0:
            return 0.0
        return out.value / 1000.0

    def __enter__(self) -> "Lock":
        return self.acquire()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        released = self.release()
        if not released and exc_type is None:
            raise LockNotHeldError(
                f"lock {self.key!r} was lost before the end of the with block "
                f"({self.lost_reason or 'expired'}): the block ran partly unprotected",
                LOCK_NOT_HELD,
            )

    def __del__(self) -> None:
        # Release a lock dropped while held; a forked child's copy is never released (the
        # library refuses it anyway).
        try:
            if self._handle and not self._released and self._pid == os.getpid():
                lib.lock_release(self._handle)
                _LIVE.pop(self._handle, None)
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        if not self._handle:
            return f"<redlease.Lock {self.key!r} not acquired>"
        return f"<redlease.Lock {self.key!r} held={self.held} handle={self._handle:#x}>"
