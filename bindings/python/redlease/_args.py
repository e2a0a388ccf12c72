"""Converting Python arguments to what the C ABI takes.

Every function here raises :class:`InvalidArgumentError` (also a ``ValueError``) for a value
it cannot convert, never ``OverflowError``, ``UnicodeEncodeError`` or ``TypeError``. Limits
the library itself checks (the 10 ms minimum ttl, the longest timeouts, reserved key names)
are left to it: it refuses them with ``LOCK_ERR_ARGUMENT``, which is the same exception.
"""

import math
import os
from typing import Optional, Tuple, Union

from ._errors import InvalidArgumentError
from ._native import UINT64_MAX

Key = Union[str, bytes]

# Durations below this many seconds (about 31 years) that are a plain float or int (not
# NaN, not negative) are converted without the checks that tell what is wrong with others.
_PLAIN_SECONDS = 1e9


def key_bytes(key: object) -> bytes:
    """A lock name as the UTF-8 bytes the C ABI takes. ``bytes`` must be valid UTF-8."""
    if type(key) is str and key.isascii():
        # The common case, without a call: ASCII encodes as is, and cannot fail.
        data = key.encode("ascii")
        if data and b"\0" not in data:
            return data
    if isinstance(key, str):
        data = utf8(key, "the key")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        data = bytes(key)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgumentError("a bytes key must be valid UTF-8") from None
        if b"\0" in data:
            raise InvalidArgumentError("the key contains a NUL character")
    else:
        raise InvalidArgumentError(f"the key must be str or bytes, not {type(key).__name__}")
    if not data:
        raise InvalidArgumentError("the key is empty")
    return data


def utf8(text: str, what: str) -> bytes:
    """``text`` as NUL-free UTF-8 (lone surrogates and NUL characters are refused)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{what} contains lone surrogates (not valid UTF-8)") from None
    if b"\0" in data:
        raise InvalidArgumentError(f"{what} contains a NUL character")
    return data


def opt_str(value: object, what: str) -> Optional[bytes]:
    """An optional string option as UTF-8 bytes, or None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a str, not {type(value).__name__}")
    return utf8(value, what)


def opt_path(value: object, what: str) -> Optional[bytes]:
    """An optional file path (``str`` or ``os.PathLike[str]``) as UTF-8 bytes, or None."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return opt_str(value, what)


def seconds(value: object, what: str) -> float:
    """A non-negative number of seconds (int or float, not bool); may be ``inf`` (but not
    an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(
            f"{what} must be a number of seconds, not {type(value).__name__}"
        )
    if isinstance(value, int) and value.bit_length() > 1000:
        # Beyond the range of a float, such as 10**400: float() would raise OverflowError.
        if value > 0:
            raise InvalidArgumentError(f"{what} is too long: an int of {value.bit_length()} bits")
        raise InvalidArgumentError(f"{what} must be a non-negative number of seconds")
    result = float(value)
    if math.isnan(result) or result < 0:
        raise InvalidArgumentError(
            f"{what} must be a non-negative number of seconds, got {value!r}"
        )
    return result


def duration_ms(value: object, what: str) -> int:
    """A finite duration in seconds as whole milliseconds, rounded to the nearest. The
    library refuses what is too short or too long for its purpose."""
    if (type(value) is float or type(value) is int) and 0 <= value < _PLAIN_SECONDS:
        return round(float(value) * 1000)  # the common case, as below without the checks
    secs = seconds(value, what)
    ms = secs * 1000
    if ms >= UINT64_MAX:  # also inf
        raise InvalidArgumentError(f"{what} is too long: {value!r} s")
    return round(ms)


def wait_ms(wait: object) -> int:
    """An acquire's wait: 0 tries once; ``None`` or ``inf`` wait as long as it takes (the C
    ABI's ``UINT64_MAX``); otherwise milliseconds, rounded up so the wait is never shorter
    than asked."""
    if wait is None:
        return UINT64_MAX
    if (type(wait) is float or type(wait) is int) and 0 <= wait < _PLAIN_SECONDS:
        return math.ceil(float(wait) * 1000)  # the common case, as below without the checks
    secs = seconds(wait, "wait")
    if math.isinf(secs):
        return UINT64_MAX
    ms = math.ceil(secs * 1000)
    if ms >= UINT64_MAX:
        raise InvalidArgumentError(
            f"wait is too long: {wait!r} s; use None to wait as long as it takes"
        )
    return ms


def positive_int(value: object, what: str, limit: int) -> int:
    """An int in ``1 .. limit - 1`` (not bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < limit:
        raise InvalidArgumentError(f"{what} must be a positive int below {limit}, got {value!r}")
    return int(value)


def uint32(value: object, what: str) -> int:
    """An int from 0 to 2**32 - 1 (not bool), such as a semaphore's permits."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise InvalidArgumentError(f"{what} must be an int from 0 to 2**32 - 1, got {value!r}")
    return int(value)


def min_replicas(value: object) -> Optional[Tuple[int, int]]:
    """``(count, timeout_seconds)`` as ``(count, timeout_ms)``; ``None`` (or a count of 0) for
    no replica acknowledgement."""
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 2:
        raise InvalidArgumentError("min_replicas must be a (count, timeout_seconds) tuple")
    count, timeout = value
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 2**32:
        raise InvalidArgumentError("the min_replicas count must be an int from 0 to 2**32 - 1")
    if count == 0:
        return None
    return count, duration_ms(timeout, "the min_replicas timeout")


def hold_options(renew: object, on_lost: object, cancel: object, cancel_type: type) -> None:
    """Checks the options every kind of hold takes: ``renew`` a bool, ``on_lost`` callable
    or None, ``cancel`` a ``cancel_type`` (a CancelToken) or None."""
    if not isinstance(renew, bool):
        raise InvalidArgumentError("renew must be a bool")
    if on_lost is not None and not callable(on_lost):
        raise InvalidArgumentError("on_lost must be callable")
    if cancel is not None and not isinstance(cancel, cancel_type):
        raise InvalidArgumentError("cancel must be a redlease.CancelToken")
