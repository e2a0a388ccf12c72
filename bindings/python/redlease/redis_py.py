"""redis-py's ``Lock`` interface, with redlease underneath: a one-argument change for a
redis-py program::

    import redis, redlease.redis_py

    r = redis.Redis(host="db", port=6379)
    with r.lock("order:1001", lock_class=redlease.redis_py.Lock, timeout=30, blocking_timeout=5):
        charge(order)

``Lock`` behaves as ``redis.lock.Lock`` does (``acquire`` returns ``True``/``False``,
``release``, ``extend``, ``reacquire``, ``locked``, ``owned``, ``local.token``, a context
manager raising ``LockError`` when it could not acquire), with redlease's guarantees: a
fresh token per acquisition, token-checked scripts, waiters woken by the release (no
polling: ``sleep`` is accepted and unused), bounded calls, a fencing token
(:attr:`Lock.fencing_token`) and the lost signal (:attr:`Lock.lost`). It is mutually
exclusive with redis-py's own ``Lock`` on the same name, both ways: both take the key named
by the lock's name. Where redis-py's semantics are unsafe, it differs (see the README):

- ``timeout=None`` (redis-py: a key that never expires) is a lease of
  :data:`RENEWED_TTL` seconds renewed while the holder lives, so a crashed holder's lock
  still expires;
- ``acquire(token=...)`` is refused: redlease draws a fresh token for every acquisition,
  which is what keeps a late release from deleting a later holder's key;
- ``extend(t)`` adds ``t`` to the lease this process knows of (a few ms under the server's
  ``PTTL`` at most), and ``replace_ttl`` never shortens the key (the lock counts on the
  shorter lease itself);
- a lock forgotten while held (its object collected, in a reference cycle too, the thread
  that took it ended, or the process exited) keeps its key until its lease ends, as
  redis-py's does, but a ``timeout=None`` lock then expires within :data:`RENEWED_TTL`
  instead of never;
- ``reacquire()`` never shortens the key's lease on the server either;
- a blocked waiter is ended by the server at its next wake-up, up to about 0.1 s after
  ``blocking_timeout``.

:class:`AsyncLock` is the twin for ``redis.asyncio.Redis``. Errors are
:class:`LockError` and :class:`LockNotOwnedError`, and for Redis failures
:class:`ConnectionError`, :class:`TimeoutError` and :class:`ResponseError`: each a subclass
of redis-py's exception of that name and of :class:`redlease.RedleaseError`.
"""

import atexit
import threading
import weakref
from typing import Any, Optional, Type, Union

import redis.exceptions

from . import _args
from ._async import AsyncLock as _NativeAsyncLock
from ._client import Client, each_at_exit
from ._errors import (
    InvalidHandleError,
    LockBusyError,
    LockNotHeldError,
    RedisConnectionError,
    RedisServerError,
    RedleaseError,
)
from ._locks import Lock as _NativeLock

Number = Union[int, float]

#: The lease, in seconds, of a lock made with ``timeout=None``: renewed every third of it
#: while the holder lives; a crashed holder's lock is free at most this long after.
RENEWED_TTL = 30.0

__all__ = [
    "Lock",
    "AsyncLock",
    "LockError",
    "LockNotOwnedError",
    "ConnectionError",
    "TimeoutError",
    "ResponseError",
    "RENEWED_TTL",
]


class LockError(redis.exceptions.LockError, RedleaseError):
    """redis-py's ``LockError`` (``lock_name`` names the lock), and a
    :class:`redlease.RedleaseError`: either ``except`` clause catches it."""

    status = InvalidHandleError.status

    def __init__(self, message: Optional[str] = None, lock_name: Optional[str] = None) -> None:
        redis.exceptions.LockError.__init__(self, message, lock_name=lock_name)
        self.status = type(self).status


def _not_acquired(name: Any) -> LockError:
    """What a ``with`` block raises when the lock could not be taken in time."""
    error = LockError("Unable to acquire lock within the time specified", lock_name=_name_text(name))
    error.status = LockBusyError.status
    return error


class ConnectionError(RedisConnectionError, redis.exceptions.ConnectionError):  # noqa: A001
    """Redis could not be reached, or a connection broke (redis-py's ``ConnectionError``,
    also a :class:`redlease.RedisConnectionError`)."""


class TimeoutError(RedisConnectionError, redis.exceptions.TimeoutError):  # noqa: A001
    """No reply, or no connection, in time (redis-py's ``TimeoutError``, also a
    :class:`redlease.RedisConnectionError`)."""


class ResponseError(RedisServerError, redis.exceptions.ResponseError):
    """The server answered with an error, or the name is another kind of lock (redis-py's
    ``ResponseError``, also a :class:`redlease.RedisServerError`)."""


# What the library raises that a redis-py program catches as redis-py's own errors.
_FAILURES = (RedisConnectionError, RedisServerError)


def _as_redis_py(error: RedleaseError) -> RedleaseError:
    """``error`` as the class of both hierarchies a redis-py program expects."""
    if isinstance(error, RedisServerError):
        cls: Type[RedleaseError] = ResponseError
    elif error.cause == "timeout":
        cls = TimeoutError
    else:
        cls = ConnectionError
    translated = cls(str(error), error.status)
    translated.outcome_unknown = error.outcome_unknown
    translated.cause = error.cause
    return translated


class LockNotOwnedError(LockError, redis.exceptions.LockNotOwnedError):
    """The lock is no longer held by this object: its lease ended or another owner holds
    it (redis-py's ``LockNotOwnedError``; also a :class:`redlease.RedleaseError`)."""

    status = LockNotHeldError.status


class _Holding:
    """One acquisition of a compatible lock: the native lock that holds it. Dropped with
    the thread-local storage of the thread that took it, or with its compatible lock,
    while still held, it lets the key expire by its lease rather than deleting it, as a
    forgotten redis-py lock does (callers rely on a lease outliving the object: "at most
    once per N seconds")."""

    __slots__ = ("native",)

    def __init__(self, native: Any) -> None:
        self.native = native

    def take(self) -> Any:
        """The native lock, for a release or an extend; the holding no longer abandons."""
        native, self.native = self.native, None
        return native

    def __del__(self) -> None:
        native = getattr(self, "native", None)
        if native is not None:
            try:
                native._abandon()
            except Exception:  # noqa: BLE001 - never raise from a finaliser
                pass


# The native locks compatible locks hold, weakly: abandoned when the interpreter exits (as
# a redis-py lock left held keeps its key until its timeout), before the clients' own exit
# handler (atexit runs handlers last in, first out; this module imports _client) closes
# their clients, which would release them.
_HELD: "weakref.WeakSet[Any]" = weakref.WeakSet()


atexit.register(each_at_exit, _HELD, lambda native: native._abandon())


# `_Local.token` of a holding whose token was not read yet.
_UNREAD: Any = object()


class _Local:
    """redis-py's ``lock.local`` without ``thread_local``: ``token`` (the key's value while
    held, as bytes; None when not held) and the holding. A holding's token is read from the
    library when first read: an acquire and release that never look at it cost one library
    call less. Assigning ``token`` works as in redis-py."""

    def __init__(self) -> None:
        self.held: Optional[_Holding] = None
        self._token: Any = None

    @property
    def token(self) -> Optional[bytes]:
        token = self._token
        if token is _UNREAD:
            holding = self.held
            native = holding.native if holding is not None else None
            try:
                token = native.token.encode("utf-8") if native is not None else None
            except InvalidHandleError:
                return None  # released with its client, unread
            self._token = token
        return token

    @token.setter
    def token(self, value: Optional[bytes]) -> None:
        self._token = value

    def took(self, holding: "_Holding") -> None:
        """``holding`` is the current one; its token is read when first wanted."""
        self._token = _UNREAD
        self.held = holding


class _ThreadLocal(_Local, threading.local):
    """:class:`_Local`, one per thread (redis-py's ``thread_local=True``)."""


def _name_text(name: Any) -> str:
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


class _Base:
    """What the thread and asyncio locks share: arguments, the per-thread holding."""

    def __init__(
        self,
        redis: Any,
        name: Union[str, bytes],
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
    ) -> None:
        self.redis = redis
        self.name = name
        self._key = _args.key_bytes(name)
        self.timeout = timeout
        if timeout is not None:
            _args.seconds(timeout, "timeout")
        self.sleep = _args.seconds(sleep, "sleep")
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        if blocking_timeout is not None:
            _args.seconds(blocking_timeout, "blocking_timeout")
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.local: Any = _ThreadLocal() if self.thread_local else _Local()
        self._client = Client.from_redis(redis)

    def _wait(self, blocking: Optional[bool], blocking_timeout: Optional[Number]) -> Optional[float]:
        """The native wait: 0 tries once, None waits as long as it takes."""
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        if not blocking:
            return 0.0
        return None if blocking_timeout is None else _args.seconds(blocking_timeout, "blocking_timeout")

    def _lock_args(self, wait: Optional[float]) -> dict:
        renewed = not self.timeout  # redis-py takes a timeout of 0 as none
        return {
            "key": self._key,
            "ttl": RENEWED_TTL if renewed else float(self.timeout),
            "wait": wait,
            "renew": renewed,
        }

    def _refuse_token(self, token: object) -> None:
        if token is not None:
            raise LockError(
                "acquire(token=...) is not supported: redlease draws a fresh token for every "
                "acquisition (a reused token lets a late release delete a later holder's key)",
                lock_name=_name_text(self.name),
            )

    def _held(self) -> Any:
        """This thread's native lock (or the object's, without thread_local), or None."""
        holding = getattr(self.local, "held", None)
        return holding.native if holding is not None else None

    def _token(self) -> Optional[bytes]:
        return getattr(self.local, "token", None)

    def _took(self, native: Any) -> None:
        native._abandon_when_dropped = True
        _HELD.add(native)
        self.local.took(_Holding(native))

    def _forget(self) -> Any:
        """Ends this thread's holding here: returns its native lock, to release."""
        holding = getattr(self.local, "held", None)
        self.local.token = None
        self.local.held = None
        return holding.take() if holding is not None else None

    def _check_held(self, doing: str) -> Any:
        # `_token`, not `token`: an unread token is not None, and need not be read here.
        if getattr(self.local, "_token", None) is None or self._held() is None:
            raise LockError(f"Cannot {doing} an unlocked lock", lock_name=_name_text(self.name))
        if not self.timeout:
            raise LockError(
                f"Cannot {doing} a lock with no timeout", lock_name=_name_text(self.name)
            )
        return self._held()

    def _extend_ttl(self, native: Any, additional_time: Number, replace_ttl: bool) -> float:
        """The new lease; raises :class:`LockError` for one the library would refuse (under
        its 10 ms floor), as redis-py raises its errors for a bad extend."""
        add = _args.seconds(additional_time, "additional_time")
        ttl = add if replace_ttl else native.remaining + add
        if ttl < 0.01:
            if not native.held:
                raise self._not_owned("extend")
            raise LockError(
                f"Cannot extend a lock to a lease of {ttl:.4f} s: the least is 0.01 s",
                lock_name=_name_text(self.name),
            )
        return ttl

    def _not_owned(self, doing: str) -> LockNotOwnedError:
        return LockNotOwnedError(
            f"Cannot {doing} a lock that's no longer owned", lock_name=_name_text(self.name)
        )

    def _release_error(self) -> LockError:
        return LockError(
            "Cannot release a lock that's not owned or is already unlocked.",
            lock_name=_name_text(self.name),
        )

    def _owned(self, stored: Any) -> bool:
        token = self._token()
        if isinstance(stored, str):
            stored = stored.encode("utf-8")
        return token is not None and stored == token

    @property
    def fencing_token(self) -> Optional[int]:
        """The fencing token of this thread's current holding (None when not held): pass
        it to the storage, which should reject older tokens."""
        native = self._held()
        return native.fencing_token if native is not None else None

    @property
    def lost(self) -> Optional[threading.Event]:
        """Set when this thread's current holding is lost (None when not held)."""
        native = self._held()
        return native.lost if native is not None else None


class Lock(_Base):
    """``redis.lock.Lock``'s interface over redlease. Made by
    ``r.lock(name, lock_class=redlease.redis_py.Lock, ...)`` or directly,
    ``Lock(r, name, ...)``; ``r`` is a ``redis.Redis``, a Sentinel master client or a
    ``RedisCluster`` (see :meth:`redlease.Client.from_redis`). Thread-safe as redis-py's:
    with ``thread_local=True`` (the default) each thread has its own holding, and only the
    thread that acquired may release or extend."""

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Takes the lock: ``True`` once held, ``False`` when ``blocking`` is false and it
        is held elsewhere, or when ``blocking_timeout`` seconds passed. A waiter is woken by
        the release (``sleep`` is unused). Blocks without the GIL. Connection and server
        errors raise :class:`ConnectionError`, :class:`TimeoutError` or
        :class:`ResponseError`: redis-py's classes, and redlease's
        (:class:`redlease.RedisConnectionError`, :class:`redlease.RedisServerError`)."""
        self._refuse_token(token)
        native = _NativeLock(self._client, **self._lock_args(self._wait(blocking, blocking_timeout)))
        try:
            native.acquire()
        except LockBusyError:
            return False
        except _FAILURES as e:
            raise _as_redis_py(e) from e
        self._took(native)
        return True

    def release(self) -> None:
        """Releases this thread's holding. Raises :class:`LockError` when not held here and
        :class:`LockNotOwnedError` when the lock was lost meanwhile (its lease ended or
        another owner took it)."""
        native = self._forget()
        if native is None:
            raise self._release_error()
        try:
            released = native.release()
        except InvalidHandleError:
            released = False
        except _FAILURES as e:
            raise _as_redis_py(e) from e
        if not released:
            raise self._not_owned("release")

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """Adds ``additional_time`` seconds to the lease (or sets the lease to it with
        ``replace_ttl``). Raises :class:`LockError` when not held or made with
        ``timeout=None`` (its lease renews itself), :class:`LockNotOwnedError` when lost."""
        native = self._check_held("extend")
        ttl = self._extend_ttl(native, additional_time, replace_ttl)
        try:
            native.extend(ttl)
        except (LockNotHeldError, InvalidHandleError):
            raise self._not_owned("extend") from None
        except _FAILURES as e:
            raise _as_redis_py(e) from e
        return True

    def reacquire(self) -> bool:
        """Sets the lease back to ``timeout``. Errors as :meth:`extend`."""
        native = self._check_held("reacquire")
        try:
            native.extend(float(self.timeout))  # type: ignore[arg-type]
        except (LockNotHeldError, InvalidHandleError):
            raise self._not_owned("reacquire") from None
        except _FAILURES as e:
            raise _as_redis_py(e) from e
        return True

    def locked(self) -> bool:
        """Whether anyone holds the lock (one ``GET`` through the redis-py client)."""
        return self.redis.get(self.name) is not None

    def owned(self) -> bool:
        """Whether this thread's holding still holds the key (one ``GET``)."""
        return self._owned(self.redis.get(self.name))

    def __enter__(self) -> "Lock":
        if self.acquire():
            return self
        raise _not_acquired(self.name)

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: object, tb: object) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            _log_release_warning()


class AsyncLock(_Base):
    """The asyncio twin of :class:`Lock`, for ``redis.asyncio.Redis``:
    ``r.lock(name, lock_class=redlease.redis_py.AsyncLock, ...)``. Blocking work runs in
    worker threads; cancelling the task ends a blocked acquire, leaving nothing held."""

    async def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """As :meth:`Lock.acquire`."""
        self._refuse_token(token)
        native = _NativeAsyncLock(
            _NativeLock(self._client, **self._lock_args(self._wait(blocking, blocking_timeout)))
        )
        try:
            await native.acquire()
        except LockBusyError:
            return False
        except _FAILURES as e:
            raise _as_redis_py(e) from e
        self._took(native.lock)
        return True

    async def release(self) -> None:
        """As :meth:`Lock.release`."""
        native = self._forget()
        if native is None:
            raise self._release_error()
        try:
            released = await _NativeAsyncLock(native).release()
        except InvalidHandleError:
            released = False
        except _FAILURES as e:
            raise _as_redis_py(e) from e
        if not released:
            raise self._not_owned("release")

    async def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """As :meth:`Lock.extend`."""
        native = self._check_held("extend")
        ttl = self._extend_ttl(native, additional_time, replace_ttl)
        try:
            await _NativeAsyncLock(native).extend(ttl)
        except (LockNotHeldError, InvalidHandleError):
            raise self._not_owned("extend") from None
        except _FAILURES as e:
            raise _as_redis_py(e) from e
        return True

    async def reacquire(self) -> bool:
        """As :meth:`Lock.reacquire`."""
        native = self._check_held("reacquire")
        try:
            await _NativeAsyncLock(native).extend(float(self.timeout))  # type: ignore[arg-type]
        except (LockNotHeldError, InvalidHandleError):
            raise self._not_owned("reacquire") from None
        except _FAILURES as e:
            raise _as_redis_py(e) from e
        return True

    async def locked(self) -> bool:
        """As :meth:`Lock.locked`."""
        return await self.redis.get(self.name) is not None

    async def owned(self) -> bool:
        """As :meth:`Lock.owned`."""
        return self._owned(await self.redis.get(self.name))

    async def __aenter__(self) -> "AsyncLock":
        if await self.acquire():
            return self
        raise _not_acquired(self.name)

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: object, tb: object) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            _log_release_warning()


def _log_release_warning() -> None:
    import logging

    logging.getLogger("redlease").warning(
        "Lock was unlocked or no longer owned when exiting context manager."
    )

