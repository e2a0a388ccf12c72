"""Exceptions, one per C status code, generated from one table."""

from typing import Dict, Optional, Type


class RedleaseError(Exception):
    """Base of every redlease error. ``status`` is the C status code. ``outcome_unknown``:
    a request went out whose reply never came, so it may have run on the server (after an
    acquire, the library tried to give back what it may have taken; at worst it lapses
    after its lease). ``cause``: ``"timeout"`` (no reply, or no connection, in time),
    ``"connection"`` (refused, unreachable or broken; nothing was sent unless
    ``outcome_unknown``), or None."""

    status: int = 0
    outcome_unknown: bool = False
    cause: "Optional[str]" = None

    def __init__(self, message: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.status = status or type(self).status


class LockBusyError(RedleaseError):
    """The wait ended while another owner held the lock (for a semaphore: while no permit
    was free; for a read-write lock: while that side was unavailable), or with a grant whose
    lease ran out before it could be confirmed (a lease of a few ms on a slow link; the
    message says which). Nothing is held."""


class LockNotHeldError(RedleaseError):
    """The key no longer holds this lock's token: the lease ended, another owner took the
    lock, or the call came from a forked child. Work since the lease ended ran unprotected."""


class LockCancelledError(RedleaseError):
    """A blocked acquire was cancelled on purpose (:meth:`redlease.CancelToken.cancel`,
    :func:`redlease.cancel_all`); never by a stray signal. Nothing is held."""


class RedisConnectionError(RedleaseError):
    """Redis unreachable, connection dropped, or an I/O timeout."""


class RedisServerError(RedleaseError):
    """The server answered with an error (NOAUTH, READONLY, OOM, ...), or the name is in use
    by another kind of lock (a mutex, a semaphore, a read-write lock: the message says so)."""


class InvalidArgumentError(RedleaseError, ValueError):
    """An unusable argument (wrong type, empty key, ttl <= 0, NaN, bad URL, a semaphore of
    0 permits, a semaphore or read-write lock asked of a Redlock client, ...).
    Nothing was sent to Redis."""


class InvalidHandleError(RedleaseError):
    """A released lock, a closed client or a freed cancel token was used."""


class InternalError(RedleaseError):
    """A bug in redlease (a Rust panic caught at the boundary), or the OS refused a thread."""


class ReplicationError(RedleaseError):
    """Too few replicas acknowledged the write (``min_replicas``): the acquire was rolled
    back and nothing is held."""


# The C status codes (include/redlease.h) and their exceptions.
LOCK_OK = 0
STATUS_ERRORS: Dict[int, Type[RedleaseError]] = {
    1: LockBusyError,
    2: LockNotHeldError,
    3: LockCancelledError,
    -1: InvalidArgumentError,
    -2: InvalidHandleError,
    -3: RedisConnectionError,
    -4: RedisServerError,
    -5: InternalError,
    -6: ReplicationError,
}
for _status, _cls in STATUS_ERRORS.items():
    _cls.status = _status
LOCK_BUSY = LockBusyError.status
LOCK_NOT_HELD = LockNotHeldError.status
LOCK_CANCELLED = LockCancelledError.status


def error_for(status: int, message: str) -> RedleaseError:
    """The exception for a non-OK status."""
    cls = STATUS_ERRORS.get(status, InternalError)
    return cls(message or f"status {status}", status)
