"""Loading libredlease and declaring its functions (include/redlease.h)."""

import ctypes
import os
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_int32,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
    byref,
)
from pathlib import Path
from typing import Any, Callable, List, Type, TypeVar

from ._errors import LOCK_OK, error_for

LIB_NAME = "libredlease.so"

# The constants of include/redlease.h (tests/test_header.py checks them against it).
lock_client_t = c_uint64
lock_t = c_uint64
lock_cancel_t = c_uint64
LOCK_TOKEN_MAX = 128
UINT64_MAX = 2**64 - 1
LOCK_LOST_NOT_HELD = 1
LOCK_LOST_UNREACHABLE = 2
LOCK_RW_READ = 1
LOCK_RW_WRITE = 2
LOCK_LOG_ERROR = 1
LOCK_LOG_WARN = 2
LOCK_LOG_INFO = 3
LOCK_LOG_DEBUG = 4
LOCK_LOG_TRACE = 5
LOCK_CAUSE_NONE = 0
LOCK_HELD_NONE = 0
LOCK_HELD_MUTEX = 1
LOCK_HELD_SEMAPHORE = 2
LOCK_HELD_RWLOCK = 3
LOCK_CAUSE_TIMEOUT = 1
LOCK_CAUSE_CONNECTION = 2

# void (*lock_lost_cb)(lock_t lock, int32_t reason, void *user_data)
LOST_CALLBACK = CFUNCTYPE(None, lock_t, c_int32, c_void_p)
# int32_t (*lock_interrupt_cb)(void *user_data): nonzero cancels
INTERRUPT_CALLBACK = CFUNCTYPE(c_int32, c_void_p)
# void (*lock_log_cb)(int32_t level, const char *target, const char *message, void *user_data)
LOG_CALLBACK = CFUNCTYPE(None, c_int32, c_char_p, c_char_p, c_void_p)
# void (*lock_user_data_free_cb)(void *user_data): unused here (one lost callback serves
# every lock, with no user_data)
USER_DATA_FREE_CALLBACK = CFUNCTYPE(None, c_void_p)


class ClientOptions(Structure):
    """``lock_client_options_t``. Make one with :func:`client_options`."""

    _fields_ = [
        ("size", c_size_t),
        ("connect_timeout_ms", c_uint64),
        ("io_timeout_ms", c_uint64),
        ("pool_size", c_uint32),
        ("pool_wait_ms", c_uint64),
        ("key_prefix", c_char_p),
        ("owner_label", c_char_p),
        ("tls_ca_cert_file", c_char_p),
    ]


class AcquireOptions(Structure):
    """``lock_acquire_options_t``. Make one with :func:`acquire_options`."""

    _fields_ = [
        ("size", c_size_t),
        ("renew", c_bool),
        ("on_lost", LOST_CALLBACK),
        ("user_data", c_void_p),
        ("cancel", lock_cancel_t),
        ("on_interrupt", INTERRUPT_CALLBACK),
        ("interrupt_user_data", c_void_p),
        ("min_replicas", c_uint32),
        ("min_replicas_timeout_ms", c_uint64),
        ("reentrant", c_bool),
        ("owner", c_char_p),
        ("user_data_free", USER_DATA_FREE_CALLBACK),
    ]


class LockInfo_t(Structure):
    """``lock_info_t``: allocated by the library, freed with ``lock_info_free``."""


LockInfo_t._fields_ = [
    ("key", c_char_p),
    ("holder", c_char_p),
    ("remaining_ms", c_uint64),
    ("fencing_token", c_uint64),
    ("waiters", c_uint64),
    ("owner", c_char_p),
    ("holds", c_uint64),
    ("next", POINTER(LockInfo_t)),
    ("held_as", c_int32),
    ("count", c_uint64),
]


class ServerCheck_t(Structure):
    """``lock_server_check_t``: allocated by the library, freed with
    ``lock_server_check_free``."""

    _fields_ = [
        ("version", c_char_p),
        ("maxmemory_policy", c_char_p),
        ("save", c_char_p),
        ("appendonly", c_char_p),
        ("appendfsync", c_char_p),
        ("may_evict_locks", c_bool),
        ("loses_data_on_restart", c_int32),
        ("round_trips_us", POINTER(c_uint64)),
        ("round_trip_count", c_size_t),
    ]


class RenewalStats_t(Structure):
    """``lock_renewal_stats_t``."""

    _fields_ = [
        ("size", c_size_t),
        ("renewals", c_uint64),
        ("failures", c_uint64),
        ("max_lateness_us", c_uint64),
        ("lateness_p50_us", c_uint64),
        ("lateness_p90_us", c_uint64),
        ("lateness_p99_us", c_uint64),
        ("lateness_p999_us", c_uint64),
    ]


class ErrorInfo_t(Structure):
    """``lock_error_info_t``."""

    _fields_ = [
        ("size", c_size_t),
        ("status", c_int32),
        ("outcome_unknown", c_bool),
        ("cause", c_int32),
    ]


#: The ``cause`` attribute of an exception, by ``lock_error_info_t.cause``.
CAUSES = {LOCK_CAUSE_TIMEOUT: "timeout", LOCK_CAUSE_CONNECTION: "connection"}


LOCK_STATS_BUCKETS = 108


class Stats_t(Structure):
    """``lock_stats_t``."""

    _fields_ = [
        ("size", c_size_t),
        ("acquisitions", c_uint64),
        ("busy", c_uint64),
        ("cancelled", c_uint64),
        ("failed", c_uint64),
        ("waits", c_uint64),
        ("wait_p50_us", c_uint64),
        ("wait_p90_us", c_uint64),
        ("wait_p99_us", c_uint64),
        ("max_wait_us", c_uint64),
        ("handoffs", c_uint64),
        ("lost_not_held", c_uint64),
        ("lost_unreachable", c_uint64),
        ("unknown_outcomes", c_uint64),
        ("renewals", c_uint64),
        ("renewal_failures", c_uint64),
        ("lateness_p50_us", c_uint64),
        ("lateness_p99_us", c_uint64),
        ("max_lateness_us", c_uint64),
        ("wait_buckets", c_uint64 * LOCK_STATS_BUCKETS),
        ("lateness_buckets", c_uint64 * LOCK_STATS_BUCKETS),
    ]


#: ``remaining_ms`` of a lock without expiry, or of a free one.
LOCK_NO_EXPIRY = 2**64 - 1


def _candidates() -> List[Path]:
    """Where the library may be, in order: ``REDLEASE_LIB`` (a path; then nothing else), the
    copy bundled in this package, and, for a package used from a source checkout (its
    ``bindings/python/redlease``), that repository's ``target/release`` and ``target/debug``.
    Never the current directory: what a program loads must not depend on where it runs."""
    env = os.environ.get("REDLEASE_LIB")
    if env:
        return [Path(env)]
    here = Path(__file__).resolve().parent
    found = [here / LIB_NAME]
    root = here.parents[2] if len(here.parents) > 2 else None
    if root is not None and (root / "Cargo.toml").is_file() and (root / "include" / "redlease.h").is_file():
        found += [root / "target" / "release" / LIB_NAME, root / "target" / "debug" / LIB_NAME]
    return found


def _load() -> "tuple[ctypes.CDLL, Path]":
    tried = _candidates()
    for path in tried:
        if path.is_file():
            return ctypes.CDLL(str(path)), path
    raise ImportError(
        "redlease: libredlease.so not found; build it with `cargo build --release` or set "
        "REDLEASE_LIB to its path. Looked in: " + ", ".join(str(p) for p in tried)
    )


lib, lib_path = _load()


def _declare(name: str, restype: Any, argtypes: List[Any]) -> None:
    """Sets the C signature of ``lib.<name>``, as include/redlease.h declares it."""
    try:
        fn = getattr(lib, name)
    except AttributeError:
        raise ImportError(
            f"redlease: {lib_path} has no {name}: it is older than this package; use the "
            "library built from the same sources"
        ) from None
    fn.restype = restype
    fn.argtypes = argtypes


_declare("lock_client_options_init", c_int32, [POINTER(ClientOptions), c_size_t])
_declare("lock_client_open", c_int32, [c_char_p, POINTER(lock_client_t)])
_declare("lock_client_open_opts", c_int32, [c_char_p, POINTER(ClientOptions), POINTER(lock_client_t)])
_declare("lock_client_close", c_int32, [lock_client_t])
_declare(
    "lock_client_open_redlock",
    c_int32,
    [POINTER(c_char_p), c_size_t, POINTER(ClientOptions), POINTER(lock_client_t)],
)
_declare("lock_client_url", c_int32, [lock_client_t, POINTER(c_char), c_size_t])
_declare("lock_acquire_options_init", c_int32, [POINTER(AcquireOptions), c_size_t])
_declare("lock_acquire", c_int32, [lock_client_t, c_char_p, c_uint64, c_uint64, POINTER(lock_t)])
_declare(
    "lock_acquire_opts",
    c_int32,
    [lock_client_t, c_char_p, c_uint64, c_uint64, POINTER(AcquireOptions), POINTER(lock_t)],
)
_declare(
    "lock_semaphore_acquire",
    c_int32,
    [lock_client_t, c_char_p, c_uint32, c_uint64, c_uint64, POINTER(AcquireOptions), POINTER(lock_t)],
)
_declare(
    "lock_rwlock_acquire",
    c_int32,
    [lock_client_t, c_char_p, c_int32, c_uint64, c_uint64, POINTER(AcquireOptions), POINTER(lock_t)],
)
_declare(
    "lock_adopt",
    c_int32,
    [lock_client_t, c_char_p, c_char_p, c_uint64, POINTER(AcquireOptions), POINTER(lock_t)],
)
_declare(
    "lock_acquire_all",
    c_int32,
    [lock_client_t, POINTER(c_char_p), c_size_t, c_uint64, c_uint64, POINTER(AcquireOptions), POINTER(lock_t)],
)
_declare("lock_release", c_int32, [lock_t])
_declare("lock_abandon", c_int32, [lock_t])
_declare("lock_extend", c_int32, [lock_t, c_uint64])
_declare("lock_is_held", c_int32, [lock_t, POINTER(c_bool)])
_declare("lock_fencing_token", c_int32, [lock_t, POINTER(c_uint64)])
_declare("lock_token", c_int32, [lock_t, POINTER(c_char), c_size_t])
_declare("lock_remaining_ms", c_int32, [lock_t, POINTER(c_uint64)])
_declare("lock_is_locked", c_int32, [lock_client_t, c_char_p, POINTER(c_bool)])
_declare("lock_cancel_new", c_int32, [POINTER(lock_cancel_t)])
_declare("lock_cancel", c_int32, [lock_cancel_t])
_declare("lock_cancel_free", c_int32, [lock_cancel_t])
_declare("lock_cancel_all", c_int32, [])
_declare("lock_cancel_reset", c_int32, [])
_declare("lock_wait_for_background_withdrawals", c_int32, [c_uint64, POINTER(c_bool)])
_declare("lock_inspect", c_int32, [lock_client_t, c_char_p, POINTER(POINTER(LockInfo_t))])
_declare(
    "lock_list",
    c_int32,
    [lock_client_t, c_char_p, c_size_t, POINTER(POINTER(LockInfo_t)), POINTER(c_size_t)],
)
_declare("lock_info_free", c_int32, [POINTER(LockInfo_t)])
_declare("lock_break", c_int32, [lock_client_t, c_char_p, c_char_p])
_declare("lock_check", c_int32, [lock_client_t, POINTER(POINTER(ServerCheck_t))])
_declare("lock_server_check_free", c_int32, [POINTER(ServerCheck_t)])
_declare("lock_renewal_stats", c_int32, [POINTER(RenewalStats_t), c_size_t])
_declare("lock_stats", c_int32, [POINTER(Stats_t), c_size_t])
_declare(
    "lock_stats_since",
    c_int32,
    [POINTER(Stats_t), POINTER(Stats_t), POINTER(Stats_t), c_size_t],
)
_declare("lock_last_error", c_char_p, [])
_declare("lock_last_error_info", c_int32, [POINTER(ErrorInfo_t), c_size_t])
_declare("lock_status_name", c_char_p, [c_int32])
_declare("lock_version", c_char_p, [])
_declare("lock_set_log_callback", c_int32, [c_int32, LOG_CALLBACK, c_void_p])


_Options = TypeVar("_Options", ClientOptions, AcquireOptions)


def _new_options(struct: Type[_Options], init: Callable[[Any, int], int]) -> _Options:
    """A ``struct`` filled with the defaults by its C ``init`` function, which writes only
    this package's ``sizeof(struct)`` bytes (a newer library's larger struct keeps its extra
    fields at their defaults on its side)."""
    opts = struct()
    check(init(byref(opts), ctypes.sizeof(struct)))
    return opts


def _check_struct(struct: Type[_Options], init: Callable[[Any, int], int]) -> None:
    """Refuses a library older than this package (it does not know our struct's size)."""
    try:
        _new_options(struct, init)
    except Exception as exc:
        raise ImportError(
            f"redlease: {lib_path} is older than this package (it does not take a "
            f"{struct.__name__} of {ctypes.sizeof(struct)} bytes); use the library built from "
            f"the same sources ({exc})"
        ) from None


def client_options() -> ClientOptions:
    """A ``lock_client_options_t`` with the library's defaults."""
    return _new_options(ClientOptions, lib.lock_client_options_init)


def acquire_options() -> AcquireOptions:
    """A ``lock_acquire_options_t`` with the library's defaults."""
    return _new_options(AcquireOptions, lib.lock_acquire_options_init)


def check(status: int) -> int:
    """Raises the exception for a non-OK status, with this thread's message, whether the
    outcome is unknown and the cause (``lock_last_error_info``)."""
    if status != LOCK_OK:
        error = error_for(status, last_error())
        info = ErrorInfo_t()
        if lib.lock_last_error_info(ctypes.byref(info), ctypes.sizeof(info)) == LOCK_OK:
            error.outcome_unknown = bool(info.outcome_unknown)
            error.cause = CAUSES.get(info.cause)
        raise error
    return status


def last_error() -> str:
    """This thread's message for its last call into the library."""
    raw = lib.lock_last_error()
    return str(raw.decode("utf-8", "replace")) if raw else ""


def read_string(fn: Callable[[int, Any, int], int], handle: int, size: int = 1024) -> str:
    """Calls ``fn(handle, buf, size)`` (a copy-into-buffer function) and decodes the text."""
    buf = ctypes.create_string_buffer(size)
    check(fn(handle, buf, size))
    return buf.value.decode("utf-8", "replace")


def version() -> str:
    """The library's version (``lock_version``)."""
    return str(lib.lock_version().decode())


# The library must know this package's option structs (checked once, at import).
_check_struct(ClientOptions, lib.lock_client_options_init)
_check_struct(AcquireOptions, lib.lock_acquire_options_init)
