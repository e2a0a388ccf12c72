"""The operators' views, as Rust and C have them: who holds a lock (:meth:`Client.inspect`),
every lock held (:meth:`Client.locks`), breaking one (:meth:`Client.break_lock`), the
server's settings (:meth:`Client.check`) and the renewal figures of the process
(:func:`renewal_stats`). Each is one C call (``lock_inspect``, ...) whose result is copied
into plain Python objects and freed at once.
"""

import ctypes
from ctypes import byref, c_size_t
from dataclasses import dataclass
from typing import List, Optional, Tuple

from . import _args, _native
from ._errors import InvalidArgumentError
from ._native import LOCK_NO_EXPIRY, lib


def _text(raw: Optional[bytes]) -> Optional[str]:
    return None if raw is None else raw.decode("utf-8", "replace")


@dataclass(frozen=True)
class LockInfo:
    """What a lock looks like on the server right now."""

    #: The lock key (the client's key prefix included).
    key: str
    #: The value under the key: the holder's token, or None when nobody holds it.
    holder: Optional[str]
    #: Seconds the key lives unless renewed; None when free or without expiry.
    remaining: Optional[float]
    #: The last fencing token handed out for this name; None when none was.
    fencing_token: Optional[int]
    #: Waiters registered now.
    waiters: int
    #: For a reentrant lock, its owner and how many holds it has; None otherwise.
    reentrant: Optional[Tuple[str, int]]
    #: What holds the name now: ``"mutex"``, ``"semaphore"``, ``"rwlock"``, or None (free).
    held_as: Optional[str] = None
    #: A semaphore's permits held, or a read-write lock's readers (``holder`` is then the
    #: writer's token, or None); 0 otherwise.
    count: int = 0


@dataclass(frozen=True)
class ServerCheck:
    """The server's version, eviction policy and persistence, and a few round trips."""

    version: str
    #: ``maxmemory-policy``; None when ``CONFIG`` is not permitted (as ``save`` and
    #: ``appendonly``).
    maxmemory_policy: Optional[str]
    save: Optional[str]
    #: ``(appendonly, appendfsync)``.
    appendonly: Optional[Tuple[str, str]]
    #: Whether the eviction policy can delete lock keys (anything but ``noeviction``).
    may_evict_locks: bool
    #: Whether a restart loses data (no RDB, no AOF); None when unknown.
    loses_data_on_restart: Optional[bool]
    #: Round trips of a few ``PING``s, in seconds.
    round_trips: List[float]


@dataclass(frozen=True)
class RenewalStats:
    """The renewal figures of this process so far (every client)."""

    #: Renewals that succeeded.
    renewals: int
    #: Renewal attempts that failed (a lock is lost only when none succeeds in time).
    failures: int
    #: The latest renewal ever sent, past its due time, in seconds.
    max_lateness: float
    #: Lateness quantiles of the renewals (to within 19 %), in seconds.
    lateness_p50: float
    lateness_p90: float
    lateness_p99: float
    lateness_p999: float


def _info(node: "_native.LockInfo_t") -> LockInfo:
    owner = _text(node.owner)
    return LockInfo(
        key=_text(node.key) or "",
        holder=_text(node.holder),
        remaining=None if node.remaining_ms == LOCK_NO_EXPIRY else node.remaining_ms / 1000.0,
        fencing_token=node.fencing_token or None,
        waiters=node.waiters,
        reentrant=None if owner is None else (owner, node.holds),
        held_as=_HELD_AS.get(node.held_as),
        count=node.count,
    )


_HELD_AS = {
    _native.LOCK_HELD_MUTEX: "mutex",
    _native.LOCK_HELD_SEMAPHORE: "semaphore",
    _native.LOCK_HELD_RWLOCK: "rwlock",
}


def _infos(head: "ctypes._Pointer[_native.LockInfo_t]") -> List[LockInfo]:
    """Copies a ``lock_info_t`` list, then frees it."""
    out = []
    try:
        node = head
        while node:
            out.append(_info(node.contents))
            node = node.contents.next
    finally:
        lib.lock_info_free(head)
    return out


def inspect(client: int, name: object) -> LockInfo:
    head = ctypes.POINTER(_native.LockInfo_t)()
    _native.check(lib.lock_inspect(client, _args.key_bytes(name), byref(head)))
    return _infos(head)[0]


def locks(client: int, pattern: str, limit: int) -> List[LockInfo]:
    if not isinstance(pattern, str):
        raise InvalidArgumentError(f"pattern must be a str, not {type(pattern).__name__}")
    limit = _args.positive_int(limit, "limit", 2**32)
    head = ctypes.POINTER(_native.LockInfo_t)()
    count = c_size_t()
    _native.check(lib.lock_list(client, _args.utf8(pattern, "pattern"), limit, byref(head), byref(count)))
    return _infos(head)


def break_lock(client: int, name: object, holder: str) -> None:
    if not isinstance(holder, str):
        raise InvalidArgumentError(f"holder must be a str, not {type(holder).__name__}")
    _native.check(lib.lock_break(client, _args.key_bytes(name), _args.utf8(holder, "holder")))


def check(client: int) -> ServerCheck:
    raw = ctypes.POINTER(_native.ServerCheck_t)()
    _native.check(lib.lock_check(client, byref(raw)))
    try:
        c = raw.contents
        aof, fsync = _text(c.appendonly), _text(c.appendfsync)
        return ServerCheck(
            version=_text(c.version) or "",
            maxmemory_policy=_text(c.maxmemory_policy),
            save=_text(c.save),
            appendonly=None if aof is None or fsync is None else (aof, fsync),
            may_evict_locks=bool(c.may_evict_locks),
            loses_data_on_restart=None if c.loses_data_on_restart < 0 else bool(c.loses_data_on_restart),
            round_trips=[c.round_trips_us[i] / 1e6 for i in range(c.round_trip_count)],
        )
    finally:
        lib.lock_server_check_free(raw)


def renewal_stats() -> RenewalStats:
    """The renewal figures of this process so far: renewals, failures and how late they
    were sent. Never blocks."""
    s = _native.RenewalStats_t()
    _native.check(lib.lock_renewal_stats(byref(s), ctypes.sizeof(s)))
    return RenewalStats(
        renewals=s.renewals,
        failures=s.failures,
        max_lateness=s.max_lateness_us / 1e6,
        lateness_p50=s.lateness_p50_us / 1e6,
        lateness_p90=s.lateness_p90_us / 1e6,
        lateness_p99=s.lateness_p99_us / 1e6,
        lateness_p999=s.lateness_p999_us / 1e6,
    )
