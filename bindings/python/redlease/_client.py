"""The client: :class:`Client`, a connection to Redis that hands out locks.

No lock logic lives here: the library decides who holds a lock. This module converts the
client's arguments and opens and closes its C handle; the locks it hands out are the lock
objects of ``_locks``, and their asyncio face is ``_async``.
"""

import atexit
import os
import threading
import weakref
from ctypes import byref, c_bool, c_char_p
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Type, Union

from . import _args, _from_redis, _inspect, _native, _registry
from ._args import Key
from ._async import AsyncLock, _off_loop
from ._cancel import CancelToken
from ._errors import InvalidArgumentError, InvalidHandleError
from ._locks import Lock, LostHandler, RwLock, Semaphore
from ._multi import MultiLock
from ._native import lib


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


# Every client still open, weakly: closed at interpreter exit (see _close_all_at_exit).
_OPEN: "weakref.WeakSet[Client]" = weakref.WeakSet()


def each_at_exit(objects: Iterable[Any], call: Callable[[Any], object]) -> None:
    """Calls ``call`` on each of ``objects`` (a snapshot), ignoring what any raises: at
    exit there is nothing to report it to."""
    for obj in list(objects):
        try:
            call(obj)
        except Exception:  # noqa: BLE001
            pass


def _close_all_at_exit() -> None:
    """Closes every client still open when the interpreter exits, releasing their locks:
    their renewal threads stop, and no lost-lock callback can reach an interpreter that is
    finalising (a library thread calling into it then would abort the process)."""
    each_at_exit(_OPEN, lambda client: client._close_now())


atexit.register(_close_all_at_exit)


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
        _OPEN.add(self)

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
        _OPEN.add(client)
        return client


    @classmethod
    def from_redis(cls, source: object) -> "Client":
        """The client for the server a redis-py client talks to: ``source`` is a
        ``redis.Redis``, a ``redis.ConnectionPool``, a ``Sentinel(...).master_for(name)``
        client or a ``redis.cluster.RedisCluster`` (or their ``redis.asyncio`` twins). It
        takes their host, port, db, username, password, TLS (``ssl_ca_certs``), unix socket,
        connect and socket timeouts, sentinel addresses and service name, or cluster
        startup nodes. One client per pool, made on first use and reused (closed when the
        pool goes); no key prefix, so a lock's key is its name, as with redis-py's ``Lock``.

        Raises :class:`InvalidArgumentError` naming what it cannot carry: a custom
        connection class, a ``credential_provider``, a client certificate, TLS without
        verification, a replica (``slave_for``) client."""
        return _from_redis.client_for(source, cls)

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
        ).acquire()

    def lock_all(
        self,
        keys: "Sequence[Key]",
        ttl: float = 30.0,
        wait: Optional[float] = None,
        *,
        renew: bool = True,
        on_lost: "Optional[Callable[[MultiLock, str], None]]" = None,
        cancel: Optional[CancelToken] = None,
    ) -> "MultiLock":
        """One lock over several names, not yet acquired: all of them or none, without
        deadlock (see :class:`MultiLock`): ``with client.lock_all(["acct:17", "acct:42"],
        wait=5) as both: ...``. Does not block. Raises :class:`InvalidArgumentError` for a
        bad argument."""
        return MultiLock(self, keys, ttl, wait, renew=renew, on_lost=on_lost, cancel=cancel)

    def adopt(
        self,
        key: Key,
        token: str,
        ttl: float = 30.0,
        *,
        renew: bool = True,
        on_lost: Optional[LostHandler] = None,
    ) -> "Lock":
        """Takes over the lock ``key`` held under ``token`` (handed over by the process that
        acquired it, e.g. in ``REDLEASE_TOKEN``): a held :class:`Lock`, checked on the
        server, with the lock's fencing token and the lease its key has left, renewed to
        ``ttl`` unless ``renew`` is false. One round trip. The hand-over contract: once it
        has handed the token over, the first holder no longer relies on the lock and does not
        release it while the adopter works; a release by either ends the lock for both, and
        the other learns it only at its next renewal or extend. Raises :class:`LockNotHeldError` when the key does not hold ``token``,
        :class:`InvalidArgumentError` for a reentrant lock's token or on a Redlock client."""
        return Lock(self, key, ttl, 0, renew=renew, on_lost=on_lost)._take_over(token)

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

    def inspect(self, name: Key) -> "_inspect.LockInfo":
        """Who holds the lock ``name`` now, for how long, its last fencing token and its
        waiters. One round trip. Raises :class:`InvalidArgumentError` on a Redlock client."""
        return _inspect.inspect(self.handle, name)

    def locks(self, pattern: str = "*", limit: int = 1000) -> "List[_inspect.LockInfo]":
        """The locks held now whose names match the glob ``pattern`` (``*``, ``?``), at most
        ``limit`` of them. Scans the keyspace in steps (``SCAN``)."""
        return _inspect.locks(self.handle, pattern, limit)

    def break_lock(self, name: Key, holder: str) -> None:
        """Deletes the lock ``name`` held by someone else, only while its key still holds
        ``holder`` (what :meth:`inspect` showed). The old holder finds its lock lost at its
        next renewal, but its critical section may still run: use it only for a holder
        known to be gone, and rely on fencing tokens. Breaks a mutex or a read-write lock's
        writer. Raises :class:`LockNotHeldError` when the key no longer holds ``holder``
        (nothing deleted), :class:`InvalidArgumentError` for a counting semaphore (its
        permits end with their own leases; nothing deleted)."""
        _inspect.break_lock(self.handle, name, holder)

    def check(self) -> "_inspect.ServerCheck":
        """Connects and reports the server's version, eviction policy, persistence, and a
        few round trips: what to look at before trusting it with locks."""
        return _inspect.check(self.handle)

    async def is_locked_async(self, key: Key) -> bool:
        """The asyncio face of :meth:`is_locked`: the round trip runs in a worker thread."""
        return await _off_loop(self.is_locked, key)

    def close(self) -> None:
        """Releases every lock still held from this client (blocking for those releases),
        then closes it. Idempotent. Does nothing on the client of :meth:`from_redis`, which
        others share: it lives as long as its redis-py pool. The Lock objects of those locks then say they are not
        held, and their ``release()`` raises :class:`InvalidHandleError`. An acquire still
        waiting on another thread waits on (a cancel ends it); if it is granted, it gives
        the lock back and raises :class:`InvalidHandleError`."""
        if getattr(self, "_shared", False):
            # Client.from_redis's client serves every user of its pool (the compatible
            # locks among them): one user's close must not release the others' locks. It is
            # closed when the pool goes, or at exit.
            return
        self._close_now()

    def _close_now(self) -> None:
        """Closes the client whoever shares it (see :meth:`close`)."""
        # Held throughout: a close racing this one returns once the locks are released.
        # Reentrant, for a finaliser that closes this client during the close.
        with self._close_lock:
            handle, self._handle = self._handle, 0
            if handle and self._pid == os.getpid():
                try:
                    _native.check(lib.lock_client_close(handle))
                finally:
                    _registry.forget_locks_of(self)

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
