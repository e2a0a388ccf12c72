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


class Stats:
    """This process's figures so far (every client): counters that only grow, and the
    quantiles of the waits and of the renewals' lateness (to within 19 %, never above the
    maximum). ``later.since(earlier)`` gives the figures of an interval. Made by
    :func:`stats`; read-only."""

    __slots__ = ("_raw",)

    def __init__(self, raw: "_native.Stats_t") -> None:
        self._raw = raw

    @property
    def acquisitions(self) -> int:
        """Acquires that took the lock (every kind; a reentrant lock's extra holds
        included)."""
        return int(self._raw.acquisitions)

    @property
    def busy(self) -> int:
        """Acquires that ended busy."""
        return int(self._raw.busy)

    @property
    def cancelled(self) -> int:
        """Acquires cancelled on purpose."""
        return int(self._raw.cancelled)

    @property
    def failed(self) -> int:
        """Acquires that failed otherwise (connection, server, replication errors)."""
        return int(self._raw.failed)

    @property
    def waits(self) -> int:
        """Acquires that had to wait (their first attempt found the lock held)."""
        return int(self._raw.waits)

    def wait_quantile(self, q: float) -> float:
        """Seconds: the 0.5, 0.9 or 0.99 quantile of the waits (others are not kept)."""
        return _pick(q, self._raw.wait_p50_us, self._raw.wait_p90_us, self._raw.wait_p99_us)

    @property
    def max_wait(self) -> float:
        """The longest wait in the life of the process, in seconds."""
        return self._raw.max_wait_us / 1e6

    @property
    def handoffs(self) -> int:
        """Releases that handed the lock straight to a waiter."""
        return int(self._raw.handoffs)

    @property
    def lost_not_held(self) -> int:
        """Locks lost because the key no longer held their token."""
        return int(self._raw.lost_not_held)

    @property
    def lost_unreachable(self) -> int:
        """Locks lost because Redis stayed unreachable until their lease ran out."""
        return int(self._raw.lost_unreachable)

    @property
    def unknown_outcomes(self) -> int:
        """Calls that failed with their outcome unknown (a request out, no reply)."""
        return int(self._raw.unknown_outcomes)

    @property
    def renewals(self) -> int:
        """Renewals that succeeded."""
        return int(self._raw.renewals)

    @property
    def renewal_failures(self) -> int:
        """Renewal attempts that failed."""
        return int(self._raw.renewal_failures)

    def lateness_quantile(self, q: float) -> float:
        """Seconds: the 0.5 or 0.99 quantile of the renewals' lateness."""
        return _pick(q, self._raw.lateness_p50_us, None, self._raw.lateness_p99_us)

    @property
    def max_lateness(self) -> float:
        """The latest renewal in the life of the process, past its due time, in seconds."""
        return self._raw.max_lateness_us / 1e6

    def since(self, earlier: "Stats") -> "Stats":
        """The figures of the interval from ``earlier`` to this snapshot (``lock_stats_since``);
        the maxima stay those of the whole life of the process."""
        if not isinstance(earlier, Stats):
            raise InvalidArgumentError(f"earlier must be a redlease.Stats, not {type(earlier).__name__}")
        out = _native.Stats_t()
        _native.check(lib.lock_stats_since(byref(self._raw), byref(earlier._raw), byref(out), ctypes.sizeof(out)))
        return Stats(out)

    def __repr__(self) -> str:
        return (
            f"<redlease.Stats acquisitions={self.acquisitions} busy={self.busy} waits={self.waits} "
            f"handoffs={self.handoffs} lost={self.lost_not_held + self.lost_unreachable} "
            f"renewals={self.renewals}>"
        )


def _pick(q: float, p50: int, p90: "Optional[int]", p99: int) -> float:
    table = {0.5: p50, 0.9: p90, 0.99: p99}
    value = table.get(q)
    if value is None:
        raise InvalidArgumentError(f"quantile {q!r} is not kept: ask for one of {sorted(k for k, v in table.items() if v is not None)}")
    return value / 1e6


def stats() -> Stats:
    """This process's figures so far (``lock_stats``). Never blocks."""
    raw = _native.Stats_t()
    _native.check(lib.lock_stats(byref(raw), ctypes.sizeof(raw)))
    return Stats(raw)
