"""redlease: a distributed lock over Redis.

A ctypes wrapper of the redlease C ABI (``libredlease.so``), so Python, C and Rust programs
contend for the same locks with exactly the same semantics::

    import redlease

    client = redlease.Client("redis://127.0.0.1:6379/0")
    with client.lock("lock:order:1001", ttl=30.0, wait=5.0) as lk:
        storage.write(order, fencing_token=lk.fencing_token)

    lk = client.acquire("lock:order:1001", ttl=30.0, wait=0.0)   # raises LockBusyError
    lk.release()   # True: released; False: it had already been lost

    with client.semaphore("api:partner", 5).acquire(ttl=10.0) as permit:   # at most 5 at once
        ...
    with client.rwlock("catalog").read(ttl=10.0, wait=5.0) as reading:    # many readers
        ...

    async with client.lock_async("lock:order:1001", wait=5.0) as lk:   # asyncio
        ...
    client.close()

Blocking calls release the GIL. Ctrl-C interrupts a blocked acquire on the main thread; a
:class:`CancelToken` ends one from another thread, and :func:`cancel_all` ends them all
(for shutting down). Nothing is held after an acquire that raised.

The library's own warnings (renewal retries, lost locks, server warnings) go to the
``redlease`` logger; :func:`set_log_level` chooses how much it sends (warnings and errors
by default).

The library is found through ``REDLEASE_LIB`` (a path), then the copy bundled in this
package, then, for a package used from a source checkout, that repository's ``target/``
folders (never the current directory's).
"""

# The modules, each importing only modules above it in this list (no import cycles):
#
#   _errors     exceptions, one per C status code
#   _native     loading libredlease and declaring its functions; its constants
#   _args       converting Python arguments to what the C ABI takes
#   _logging    the library's log records, forwarded to the "redlease" logger
#   _cancel     CancelToken, cancel_all
#   _kinds      what a Lock holds: the C call that takes a mutex, a permit, a read or write hold
#   _signals    Ctrl-C during a blocked acquire: the signal catcher
#   _registry   which Lock each held C handle belongs to: the lost-lock callback, adoption
#               of acquired handles, early loss reports, the cleanup when a client closes
#   _locks      Lock, Semaphore, RwLock
#   _async      AsyncLock, the asyncio face of a Lock
#   _multi      MultiLock, one lock over several names
#   _inspect    the operators' views: LockInfo, ServerCheck, RenewalStats
#   _from_redis the redlease client for a redis-py client (Client.from_redis)
#   _client     Client
#   _exit       what the interpreter's exit waits for (background give-backs)
#
# and, imported only by who asks for it (it needs redis-py):
#
#   redis_py    redis-py's Lock interface over redlease (Lock, AsyncLock)
from ._async import AsyncLock
from ._cancel import CancelToken, cancel_all, reset_cancel_all
from ._client import Client
from ._exit import wait_for_background_withdrawals
from ._errors import (
    InternalError,
    InvalidArgumentError,
    InvalidHandleError,
    LockBusyError,
    LockCancelledError,
    LockNotHeldError,
    RedisConnectionError,
    RedisServerError,
    RedleaseError,
    ReplicationError,
)
from ._inspect import LockInfo, RenewalStats, ServerCheck, Stats, renewal_stats, stats
from ._locks import Lock, RwLock, Semaphore
from ._multi import MultiLock
from ._logging import set_log_level
from ._native import version
from ._registry import LOST_REASONS

__version__ = "0.2.0"

__all__ = [
    "Client",
    "Lock",
    "Semaphore",
    "RwLock",
    "AsyncLock",
    "CancelToken",
    "cancel_all",
    "reset_cancel_all",
    "LOST_REASONS",
    "RedleaseError",
    "LockBusyError",
    "LockNotHeldError",
    "LockCancelledError",
    "RedisConnectionError",
    "RedisServerError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "InternalError",
    "ReplicationError",
    "version",
    "set_log_level",
    "LockInfo",
    "ServerCheck",
    "RenewalStats",
    "renewal_stats",
    "Stats",
    "stats",
    "MultiLock",
    "wait_for_background_withdrawals",
]
