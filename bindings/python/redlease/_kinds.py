"""What a :class:`Lock` object holds: a mutex, a permit of a counting semaphore, or a read or
write hold of a read-write lock.

A kind is only the C call that takes one hold of it. Everything else (release, extend, the
lost signal, fencing tokens, the local view) is the same C calls for every kind, because the
C ABI gives every hold an ordinary ``lock_t`` handle; so one :class:`Lock` class serves all.
"""

from typing import Any, Callable

from ._native import LOCK_RW_READ, LOCK_RW_WRITE, lib

# The C acquire of a kind: (client, name, ttl_ms, wait_ms, opts, out) -> status. Blocking;
# ctypes releases the GIL for the call.
Take = Callable[[int, bytes, int, int, Any, Any], int]


class Kind:
    """A kind of hold: the C call that takes one, and how messages name it."""

    __slots__ = ("_label", "take")

    def __init__(self, label: str, take: Take) -> None:
        self._label = label
        #: Takes one hold (``lock_acquire_opts`` or its kind's sibling); returns the status.
        #: The C function itself for a mutex: no Python frame between the caller and it.
        self.take = take

    def describe(self, name: str) -> str:
        """``name`` as messages call it: ``lock 'x'``, ``semaphore 'x'``, ..."""
        return self._label.format(repr(name))


#: A mutex (``client.lock``, ``client.acquire``).
MUTEX = Kind("lock {}", lib.lock_acquire_opts)


def permit(permits: int) -> Kind:
    """A permit of a semaphore that lets ``permits`` holders in at once."""

    def take(client: int, name: bytes, ttl_ms: int, wait_ms: int, opts: Any, out: Any) -> int:
        return int(lib.lock_semaphore_acquire(client, name, permits, ttl_ms, wait_ms, opts, out))

    return Kind("semaphore {}", take)


def _side(side: int) -> Take:
    def take(client: int, name: bytes, ttl_ms: int, wait_ms: int, opts: Any, out: Any) -> int:
        return int(lib.lock_rwlock_acquire(client, name, side, ttl_ms, wait_ms, opts, out))

    return take


#: A read hold of a read-write lock (shared with other readers).
READ = Kind("read-write lock {} (read)", _side(LOCK_RW_READ))
#: The write hold of a read-write lock (exclusive).
WRITE = Kind("read-write lock {} (write)", _side(LOCK_RW_WRITE))
