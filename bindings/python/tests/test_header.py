"""One source of truth: include/redlease.h. Every constant, status code, lost reason, log
level, struct layout, callback type and function signature that the Python package copies
from the header is checked against it here, so that the two can never drift apart.

Struct layouts are checked against the C compiler's own answer (a tiny program printing
sizeof and offsetof), not against a reading of the header."""

import ctypes
import os
import re
import shutil
import subprocess
from ctypes import POINTER, c_bool, c_char, c_char_p, c_int32, c_size_t, c_uint32, c_uint64, c_void_p
from pathlib import Path

import pytest

import redlease
from redlease import _errors, _logging, _native
from redlease._registry import LOST_REASONS

HEADER_PATH = Path(__file__).resolve().parents[3] / "include" / "redlease.h"


def _without_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


@pytest.fixture(scope="module")
def header() -> str:
    if not HEADER_PATH.is_file():
        pytest.fail(f"no header at {HEADER_PATH}")
    return _without_comments(HEADER_PATH.read_text())


@pytest.fixture(scope="module")
def defines(header):
    found = {}
    for name, value in re.findall(r"^#define (\w+) (.+)$", header, flags=re.M):
        value = value.strip()
        if value.startswith('"'):
            found[name] = value.strip('"')
        else:
            found[name] = {"UINT64_MAX": 2**64 - 1}.get(value) or int(value)
    return found


# The exception class of each status (DESIGN.md §5): a new status in the header fails this
# test until the Python package has its exception.
EXCEPTIONS = {
    "LOCK_BUSY": "LockBusyError",
    "LOCK_NOT_HELD": "LockNotHeldError",
    "LOCK_CANCELLED": "LockCancelledError",
    "LOCK_ERR_ARGUMENT": "InvalidArgumentError",
    "LOCK_ERR_HANDLE": "InvalidHandleError",
    "LOCK_ERR_CONNECTION": "RedisConnectionError",
    "LOCK_ERR_REDIS": "RedisServerError",
    "LOCK_ERR_INTERNAL": "InternalError",
    "LOCK_ERR_REPLICATION": "ReplicationError",
}


def _statuses(defines):
    """The header's status codes: the LOCK_* constants that lock_status_name names."""
    return {
        name: value
        for name, value in defines.items()
        if name.startswith("LOCK_") and isinstance(value, int)
        and _native.lib.lock_status_name(value).decode() == name
    }


def test_status_codes_and_exceptions_match_the_header(defines):
    statuses = _statuses(defines)
    assert statuses["LOCK_OK"] == _errors.LOCK_OK == 0
    assert set(statuses) - {"LOCK_OK"} == set(EXCEPTIONS), "a status without an exception class"
    assert set(_errors.STATUS_ERRORS) == set(statuses.values()) - {0}
    for name, class_name in EXCEPTIONS.items():
        cls = getattr(redlease, class_name)
        assert class_name in redlease.__all__
        assert issubclass(cls, redlease.RedleaseError)
        assert cls.status == statuses[name], name
        assert _errors.STATUS_ERRORS[statuses[name]] is cls
        err = _errors.error_for(statuses[name], "message")
        assert type(err) is cls and err.status == statuses[name]
    assert issubclass(redlease.InvalidArgumentError, ValueError)
    assert _errors.LOCK_BUSY == defines["LOCK_BUSY"]
    assert _errors.LOCK_NOT_HELD == defines["LOCK_NOT_HELD"]
    assert _errors.LOCK_CANCELLED == defines["LOCK_CANCELLED"]


def test_every_other_constant_is_the_packages(defines):
    """Every LOCK_* constant that is not a status has the same value in _native."""
    statuses = _statuses(defines)
    others = {n: v for n, v in defines.items() if n.startswith("LOCK_") and n not in statuses}
    assert others, "no constants found in the header"
    for name, value in others.items():
        assert getattr(_native, name, None) == value, f"{name} = {value} in the header"


def test_lost_reasons_match_the_header(defines):
    reasons = {v: n[len("LOCK_LOST_"):].lower() for n, v in defines.items() if n.startswith("LOCK_LOST_")}
    assert reasons == LOST_REASONS


def test_log_levels_match_the_header(defines):
    levels = {v for n, v in defines.items() if n.startswith("LOCK_LOG_")}
    assert levels == set(_logging.PYTHON_LEVELS)
    assert [_logging.PYTHON_LEVELS[defines[f"LOCK_LOG_{n}"]] for n in ("ERROR", "WARN", "INFO", "DEBUG")] == [
        40, 30, 20, 10,
    ]


def test_the_version_macros_match_the_package_and_the_library(defines):
    version = f"{defines['REDLEASE_VERSION_MAJOR']}.{defines['REDLEASE_VERSION_MINOR']}.{defines['REDLEASE_VERSION_PATCH']}"
    assert defines["REDLEASE_VERSION_STRING"] == version
    assert redlease.__version__ == version
    assert redlease.version() == version


# How the header's C types are declared with ctypes.
_SCALARS = {
    "int32_t": c_int32,
    "uint32_t": c_uint32,
    "uint64_t": c_uint64,
    "size_t": c_size_t,
    "bool": c_bool,
    "void": None,
}
_CALLBACKS = {
    "lock_lost_cb": _native.LOST_CALLBACK,
    "lock_interrupt_cb": _native.INTERRUPT_CALLBACK,
    "lock_log_cb": _native.LOG_CALLBACK,
    "lock_user_data_free_cb": _native.USER_DATA_FREE_CALLBACK,
}
_STRUCTS = {
    "lock_client_options_t": _native.ClientOptions,
    "lock_acquire_options_t": _native.AcquireOptions,
    "lock_info_t": _native.LockInfo_t,
    "lock_server_check_t": _native.ServerCheck_t,
    "lock_renewal_stats_t": _native.RenewalStats_t,
    "lock_error_info_t": _native.ErrorInfo_t,
    "lock_stats_t": _native.Stats_t,
}


def _typedefs(header):
    return dict((alias, base) for base, alias in re.findall(r"typedef (\w+) (\w+);", header))


def _ctype(c_type: str, typedefs, field: bool = False):
    """The ctypes type for a C type spelled as in the header. A ``char *`` field of a struct
    is a string the library owns (``c_char_p``); a ``char *`` parameter is a buffer;
    ``T[N]`` an array of a constant's length."""
    t = " ".join(c_type.replace("struct ", "").split())
    array = re.match(r"(.*)\[(\w+)\]$", t)
    if array:
        return _ctype(array.group(1), typedefs, field) * getattr(_native, array.group(2))
    if t in ("const char *", "const char*") or (field and t == "char *"):
        return c_char_p
    if t.endswith("*"):
        inner = t[:-1].strip()
        if inner.endswith("const"):  # const char *const *
            inner = inner[: -len("const")].strip()
        inner = inner[len("const "):] if inner.startswith("const ") else inner
        if inner == "void":
            return c_void_p
        if inner == "char":
            return POINTER(c_char)
        return POINTER(_ctype(inner if inner != "char *" else "const char *", typedefs))
    if t in _STRUCTS:
        return _STRUCTS[t]
    if t in _CALLBACKS:
        return _CALLBACKS[t]
    t = typedefs.get(t, t)
    if t not in _SCALARS:
        raise AssertionError(f"no ctypes type known for the C type {c_type!r}")
    return _SCALARS[t]


def _params(text: str):
    """[(type, name)] of a C parameter list."""
    text = " ".join(text.split())
    if text in ("", "void"):
        return []
    out = []
    for param in text.split(","):
        m = re.match(r"(.*?)(\w+)$", param.strip())
        assert m, param
        out.append((m.group(1).strip(), m.group(2)))
    return out


def _struct_fields(header):
    structs = {}
    for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", header, flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = " ".join(decl.split())
            if decl:
                m = re.match(r"(.*?)(\w+)(?:\[(\w+)\])?$", decl)
                assert m, decl
                c_type = m.group(1).strip() + (f"[{m.group(3)}]" if m.group(3) else "")
                fields.append((c_type, m.group(2)))
        structs[name] = fields
    return structs


def test_callback_types_match_the_header(header):
    typedefs = _typedefs(header)
    found = re.findall(r"typedef (\w[\w ]*?) ?\(\*(\w+)\)\((.*?)\);", header, flags=re.S)
    assert {name for _, name, _ in found} == set(_CALLBACKS)
    for restype, name, params in found:
        proto = _CALLBACKS[name]
        assert proto._restype_ == _ctype(restype, typedefs), name
        assert list(proto._argtypes_) == [_ctype(t, typedefs) for t, _ in _params(params)], name


def test_every_function_is_declared_with_the_headers_signature(header):
    typedefs = _typedefs(header)
    functions = re.findall(r"^(int32_t|const char \*|void) ?(lock_\w+)\((.*?)\);", header, flags=re.S | re.M)
    assert len(functions) > 20
    for restype, name, params in functions:
        fn = getattr(_native.lib, name)
        assert fn.restype == _ctype(restype, typedefs), name
        assert fn.argtypes is not None, f"{name} is not declared in _native"
        expected = [_ctype(t, typedefs) for t, _ in _params(params)]
        assert list(fn.argtypes) == expected, name


def test_struct_fields_match_the_header(header):
    typedefs = _typedefs(header)
    structs = _struct_fields(header)
    assert set(structs) == set(_STRUCTS)
    for c_name, fields in structs.items():
        py = _STRUCTS[c_name]
        assert [n for n, _ in py._fields_] == [n for _, n in fields], c_name
        for (py_name, py_type), (c_type, _) in zip(py._fields_, fields):
            assert py_type == _ctype(c_type, typedefs, field=True), f"{c_name}.{py_name}"


def test_struct_layouts_match_the_c_compiler(header, tmp_path):
    # CC: the test command runs these tests with no compiler on PATH (the installed wheel
    # needs none), and names one for this check.
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    structs = _struct_fields(header)
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "redlease.h"', "int main(void) {"]
    for c_name, fields in structs.items():
        lines.append(f'  printf("{c_name} %zu %zu\\n", sizeof({c_name}), (size_t)_Alignof({c_name}));')
        for _, field in fields:
            lines.append(
                f'  printf("{c_name}.{field} %zu %zu\\n", offsetof({c_name}, {field}), '
                f"sizeof((({c_name} *)0)->{field}));"
            )
    lines += ["  return 0;", "}"]
    source = tmp_path / "layout.c"
    source.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    # The compiler finds its assembler and linker beside it (PATH may hold no tools).
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(cc), os.environ.get("PATH", "")]))
    subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", f"-I{HEADER_PATH.parent}", str(source), "-o", str(exe)],
        check=True,
        env=env,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    c_layout = {k: tuple(map(int, rest.split())) for k, rest in (l.split(" ", 1) for l in out.splitlines())}
    for c_name, py in _STRUCTS.items():
        assert c_layout[c_name] == (ctypes.sizeof(py), ctypes.alignment(py)), c_name
        for field, _ in py._fields_:
            descriptor = getattr(py, field)
            assert c_layout[f"{c_name}.{field}"] == (descriptor.offset, descriptor.size), f"{c_name}.{field}"
