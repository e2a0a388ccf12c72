"""Argument conversion: every unusable value is an InvalidArgumentError (a ValueError),
never OverflowError, UnicodeEncodeError or TypeError; and the C structs match the library."""

import ctypes
import logging
import math
import threading

import pytest

import redlease
from redlease import InvalidArgumentError, InvalidHandleError, LockNotHeldError, _args, _native

HUGE = 10**400
BAD_DURATIONS = [HUGE, -HUGE, math.nan, -1.0, -1, True, False, "1", None, math.inf]


@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_bad_ttls_are_invalid_arguments(client, r, value):
    with pytest.raises(InvalidArgumentError):
        client.acquire("args", ttl=value, wait=0)
    assert r.dbsize() == 0


@pytest.mark.parametrize("value", [HUGE, -HUGE, math.nan, -1.0, True, "1", 1e30])
def test_bad_waits_are_invalid_arguments(client, value):
    with pytest.raises(InvalidArgumentError):
        client.lock("args", wait=value)


@pytest.mark.parametrize("option", ["connect_timeout", "io_timeout", "pool_wait"])
@pytest.mark.parametrize("value", [HUGE, -HUGE, math.nan, -1.0, True, math.inf, 10**9])
def test_bad_client_durations_are_invalid_arguments(server, option, value):
    with pytest.raises(InvalidArgumentError):
        redlease.Client(server.url, **{option: value})


@pytest.mark.parametrize("value", [0, HUGE, -1, True, 2**32, 1.5])
def test_bad_pool_sizes_are_invalid_arguments(server, value):
    with pytest.raises(InvalidArgumentError):
        redlease.Client(server.url, pool_size=value)


def test_bad_extends_are_invalid_arguments(client):
    with client.lock("extend-args", wait=0) as lk:
        for value in (HUGE, math.nan, -1.0, True, 0):
            with pytest.raises(InvalidArgumentError):
                lk.extend(value)
        assert lk.held


def test_the_minimum_ttl_is_ten_milliseconds(client):
    with pytest.raises(InvalidArgumentError):
        client.acquire("short", ttl=0.005, wait=0)
    lk = client.acquire("short", ttl=0.01, wait=0, renew=False)
    lk.release()


def test_pool_wait_zero_is_valid(server):
    with redlease.Client(server.url, pool_wait=0, pool_size=1) as c:
        with c.lock("pool-wait-0", wait=0) as lk:
            assert lk.held


@pytest.mark.parametrize("option", ["key_prefix", "owner_label", "tls_ca_cert_file"])
def test_lone_surrogates_in_options_are_invalid_arguments(server, option):
    with pytest.raises(InvalidArgumentError):
        redlease.Client(server.url, **{option: "a\ud800b"})


def test_lone_surrogates_in_urls_and_keys_are_invalid_arguments(client, r):
    with pytest.raises(InvalidArgumentError):
        redlease.Client("redis://127.0.0.1:1/0\udcff")
    for call in (
        lambda: client.acquire("key\ud800", wait=0),
        lambda: client.lock("\udfff"),
        lambda: client.is_locked("key\ud800"),
        lambda: client.lock_async("key\ud800"),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
    assert r.dbsize() == 0


@pytest.mark.parametrize("key", ["", b"", "a\0b", b"a\0b", "\0"])
def test_empty_keys_and_keys_with_nul_are_invalid_arguments(client, r, key):
    with pytest.raises(InvalidArgumentError):
        client.acquire(key, wait=0)
    assert r.dbsize() == 0


def test_keys_and_durations_convert_alike_on_every_path():
    # Plain ASCII keys, and plain numbers below 10**9 s, take a short way: the same values.
    assert _args.key_bytes("order:1001") == b"order:1001"
    assert _args.key_bytes("zähler") == "zähler".encode("utf-8")
    assert _args.key_bytes(b"order:1001") == b"order:1001"
    for value in (0, 0.0004, 0.0005, 0.0015, 1, 2.5, 30, 999_999_999, 999_999_999.9, 10**9, 1e9, 4e9):
        secs = float(value)
        assert _args.duration_ms(value, "ttl") == round(secs * 1000), value
        assert _args.wait_ms(value) == math.ceil(secs * 1000), value
    assert _args.wait_ms(None) == _args.wait_ms(math.inf) == _native.UINT64_MAX


def test_reserved_key_names_are_invalid_arguments(client, r):
    for key in ("redlease:fence:{k}", "redlease:anything"):
        with pytest.raises(InvalidArgumentError):
            client.acquire(key, wait=0)
    assert r.dbsize() == 0


def test_option_structs_match_the_library():
    for make, defaults in (
        (_native.client_options, {"connect_timeout_ms": 2000, "io_timeout_ms": 2000,
                                  "pool_size": 32, "pool_wait_ms": 2000, "key_prefix": None}),
        (_native.acquire_options, {"renew": True, "user_data": None, "cancel": 0,
                                   "interrupt_user_data": None}),
    ):
        opts = make()
        assert opts.size == ctypes.sizeof(opts), "the library's struct has another size"
        for field, value in defaults.items():
            assert getattr(opts, field) == value, field
    assert not _native.acquire_options().on_interrupt
    assert not _native.acquire_options().on_lost


def test_a_failed_release_never_replaces_the_blocks_exception(server, caplog):
    c = redlease.Client(server.url)
    caplog.set_level(logging.WARNING, logger="redlease")
    with pytest.raises(KeyError, match="the block's own"):
        with c.lock("closed-in-block", wait=0):
            t = threading.Thread(target=c.close)  # another thread closes the client
            t.start()
            t.join()
            raise KeyError("the block's own")
    assert any(
        rec.name == "redlease" and rec.exc_info and isinstance(rec.exc_info[1], InvalidHandleError)
        for rec in caplog.records
    ), caplog.records


def test_a_lost_lock_never_replaces_the_blocks_exception_and_is_logged(client, r, caplog):
    caplog.set_level(logging.WARNING, logger="redlease")
    with pytest.raises(ZeroDivisionError):
        with client.lock("lost-then-raise", ttl=0.3, wait=0) as lk:
            r.delete("lost-then-raise")
            assert lk.lost.wait(3.0)
            raise ZeroDivisionError("the block's own")
    assert any("was lost" in rec.getMessage() for rec in caplog.records if rec.name == "redlease")


def test_leaving_normally_after_the_client_closed_raises(server):
    c = redlease.Client(server.url)
    with pytest.raises(InvalidHandleError):
        with c.lock("closed-normal", wait=0):
            c.close()


def test_leaving_normally_after_a_loss_raises_lock_not_held(client, r):
    with pytest.raises(LockNotHeldError):
        with client.lock("lost-normal", ttl=0.3, wait=0) as lk:
            r.set("lost-normal", "thief")
            assert lk.lost.wait(3.0)
    assert r.get("lost-normal") == "thief"
