"""The asyncio face of a Lock: the blocking C calls run in worker threads.

A blocked acquire runs in a thread of its own with a fresh :class:`CancelToken`, so that
cancelling the awaiting task ends it promptly: the token is cancelled, the task waits for the
thread to finish (holding nothing, or, if the lock was granted in the meantime, releasing
it), then ``CancelledError`` goes on. Acquires do not use the loop's default executor,
whose few threads a handful of long waits would otherwise occupy (stalling every
``to_thread`` call and the cancellation of an acquire queued behind them). Releases and
extends, which are short, do.
"""

import asyncio
import functools
import logging
import threading
from typing import Any, Callable, Optional, Type, TypeVar

from ._cancel import CancelToken
from ._locks import Lock

log = logging.getLogger("redlease")

T = TypeVar("T")


def _in_thread(fn: Callable[[], T], undo: Callable[[T], Any]) -> "asyncio.Future[T]":
    """Runs ``fn`` in a new thread; its outcome resolves the returned future. When the loop
    is gone by then, ``undo`` is applied to a result nobody can receive."""
    loop = asyncio.get_running_loop()
    fut: "asyncio.Future[T]" = loop.create_future()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        if not fut.done():
            setter(value)

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            try:
                loop.call_soon_threadsafe(deliver, fut.set_exception, exc)
            except RuntimeError:  # the loop is closed
                pass
            return
        try:
            loop.call_soon_threadsafe(deliver, fut.set_result, result)
        except RuntimeError:  # the loop is closed: nobody will release what was acquired
            undo(result)

    threading.Thread(target=run, name="redlease-acquire", daemon=True).start()
    return fut


async def _until_done(fut: "asyncio.Future[Any]") -> bool:
    """Waits until ``fut`` is done even if the task is cancelled meanwhile; returns whether
    it was (the caller then raises ``CancelledError`` in its turn)."""
    cancelled = False
    while not fut.done():
        try:
            await asyncio.wait({fut})
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


def _release_quietly(lock: Lock) -> None:
    try:
        lock.release()
    except Exception:  # noqa: BLE001 - nobody is left to tell but the log
        log.warning(
            "redlease: releasing lock %r after a cancelled acquire failed", lock.key, exc_info=True
        )


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Runs a short blocking call in the loop's default executor. If the task is cancelled
    meanwhile, the call still completes before ``CancelledError`` goes on."""
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(None, functools.partial(fn, *args))
    if await _until_done(fut):
        fut.exception()  # retrieved: the cancellation is what the task reports
        raise asyncio.CancelledError()
    return fut.result()


class AsyncLock:
    """The asyncio face of a :class:`Lock` (made by :meth:`Client.lock_async` or
    :meth:`Client.acquire_async`)::

        async with client.lock_async("lock:order:1001", ttl=30.0, wait=5.0) as lk:
            await storage.write(order, fencing_token=lk.fencing_token)

    Every blocking call runs off the event loop. Several tasks may share one AsyncLock: as
    with :class:`asyncio.Lock`, one holds it at a time and the others wait their turn. The
    properties read the local view and never block. Leaving ``async with`` follows the
    rules of ``with`` (see :class:`Lock`); a task cancelled during that release still
    completes it, then raises ``CancelledError``.
    """

    def __init__(self, lock: Lock) -> None:
        self._lock = lock

    @property
    def lock(self) -> Lock:
        """The underlying (blocking) :class:`Lock`."""
        return self._lock

    async def acquire(self) -> "AsyncLock":
        """Acquires the lock, waiting as configured, in a worker thread; returns self.

        Cancelling the awaiting task ends the wait: ``CancelledError`` is raised once the
        worker has finished, and nothing is held. Otherwise raises as :meth:`Lock.acquire`
        (:class:`LockBusyError`, :class:`InvalidArgumentError`, ...)."""
        owner = asyncio.current_task()
        with CancelToken() as token:
            fut = _in_thread(functools.partial(self._lock._acquire, token, owner), _release_quietly)
            try:
                await asyncio.shield(fut)
            except asyncio.CancelledError:
                token.cancel()
                await _until_done(fut)
                if not fut.cancelled() and fut.exception() is None:
                    # Granted before the cancellation took effect: give it back.
                    await _off_loop(_release_quietly, self._lock)
                raise
        return self

    async def release(self) -> bool:
        """Releases the current holding, in a worker thread. As :meth:`Lock.release`: True
        when released, False when it had already been lost; raises
        :class:`InvalidHandleError` when not held. A cancelled task still completes the
        release before ``CancelledError`` goes on."""
        return await _off_loop(self._lock.release)

    async def extend(self, ttl: float) -> None:
        """As :meth:`Lock.extend`, in a worker thread."""
        await _off_loop(self._lock.extend, ttl)

    @property
    def key(self) -> str:
        """The lock name."""
        return self._lock.key

    @property
    def held(self) -> bool:
        """As :attr:`Lock.held` (local view; sends nothing)."""
        return self._lock.held

    @property
    def fencing_token(self) -> int:
        """As :attr:`Lock.fencing_token`."""
        return self._lock.fencing_token

    @property
    def token(self) -> str:
        """As :attr:`Lock.token`."""
        return self._lock.token

    @property
    def remaining(self) -> float:
        """As :attr:`Lock.remaining`."""
        return self._lock.remaining

    @property
    def lost(self) -> threading.Event:
        """As :attr:`Lock.lost` (a :class:`threading.Event`: check ``is_set()``)."""
        return self._lock.lost

    @property
    def lost_reason(self) -> Optional[str]:
        """As :attr:`Lock.lost_reason`."""
        return self._lock.lost_reason

    async def __aenter__(self) -> "AsyncLock":
        return await self.acquire()

    async def __aexit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: object
    ) -> None:
        # Lock.__exit__ in a worker thread: the same rules for a lost lock and for a release
        # that fails while the block's exception propagates.
        await _off_loop(self._lock.__exit__, exc_type, exc, tb)

    def __repr__(self) -> str:
        return "<redlease.AsyncLock " + repr(self._lock)[len("<redlease.") :]
