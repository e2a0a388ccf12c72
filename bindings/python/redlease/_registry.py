"""The registry of held locks: which Lock each held C handle belongs to.

The library reports a lost lock through one C callback shared by every lock, with the
lock's handle; the registry finds the Lock it belongs to. It also covers the moments when
a handle has no Lock yet or no longer has one: the adoption of a freshly acquired handle
(a loss reported before it is registered is kept for it), and the cleanup when a client
is closed (the library reports nothing more for its handles).

The registry knows a Lock only as a :class:`Holder` (and, when a client closes, by its
``_client``); the lock objects (``_locks``) keep their own fields, under the same
:data:`_REGISTRY`.
"""

import threading
import weakref
from typing import Dict, Optional, Protocol

from . import _native


class Holder(Protocol):
    """What the registry needs of a Lock: to be told that one of its holdings was lost."""

    def _lost(self, handle: int, reason: str) -> None: ...


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
_LIVE: Dict[int, "weakref.ref[Holder]"] = {}
_EARLY_LOSS: Dict[int, str] = {}
_ADOPTING = [0]
_REGISTRY = threading.RLock()


def _lost_from_c(handle: int, reason: int, _user_data: object) -> None:
    why = LOST_REASONS.get(reason, "unknown")
    with _REGISTRY:
        ref = _LIVE.get(handle)
        lk = ref() if ref is not None else None
        if lk is None and _ADOPTING[0]:
            _EARLY_LOSS[handle] = why
    if lk is not None:
        lk._lost(handle, why)


def adopting_begin() -> None:
    """Marks an acquire between its C call and its registration: a loss reported for its
    handle meanwhile is kept for it. Every call is followed by one of
    :func:`adopting_end`, in a ``finally``."""
    with _REGISTRY:
        _ADOPTING[0] += 1


def adopting_end() -> None:
    """Ends what :func:`adopting_begin` began."""
    with _REGISTRY:
        _ADOPTING[0] -= 1
        if not _ADOPTING[0]:
            _EARLY_LOSS.clear()  # late reports for handles nobody will register


# One C callback for every lock (kept alive for the life of the module).
on_lost_from_c = _native.LOST_CALLBACK(_lost_from_c)


def register(handle: int, ref: "weakref.ref[Holder]") -> None:
    """Records ``handle`` as held by the Lock ``ref`` refers to. The caller holds
    :data:`_REGISTRY`."""
    _LIVE[handle] = ref


def take_early_loss(handle: int) -> Optional[str]:
    """The loss reported for ``handle`` before it was registered, if any (once). The caller
    holds :data:`_REGISTRY`, and reports the loss once out of it."""
    return _EARLY_LOSS.pop(handle, None)


def forget(handle: int) -> None:
    """Forgets ``handle`` (released or about to be). Takes no lock (a finaliser must not):
    each step is one dictionary operation, which the GIL keeps whole, and removing an
    entry already gone does nothing (handles are never reused)."""
    _LIVE.pop(handle, None)
    _EARLY_LOSS.pop(handle, None)


def forget_locks_of(client: object) -> None:
    """Drops ``client``'s locks from the registry, once it is closed: the library reports no
    loss for a closed client's handles, and an entry kept for a Lock nobody touches again
    would live as long as the object."""
    with _REGISTRY:
        pass  # an _adopt that found this client open has registered its handle by now
    # Chosen from a copy, outside _REGISTRY: what allocates may run the collector, and
    # with it a Lock's finaliser, which calls the library and pops its own entry.
    mine = [h for h, ref in _LIVE.copy().items() if getattr(ref(), "_client", None) is client]
    with _REGISTRY:
        for handle in mine:
            _LIVE.pop(handle, None)  # handles are never reused: the entry is this one
