#!/usr/bin/env bash
# Installs redlease into a temporary prefix with scripts/install.sh and uses it as a C
# programmer would: the files and symlinks, the SONAME (readelf -d), redlease.pc, a C program
# (tests/install_check.c) built with `pkg-config --cflags --libs redlease` and run from the
# prefix, the same program built with `pkg-config --static --cflags --libs redlease` against
# a static-only install, both against a redis-server of this script's own; the command-line
# tool. Run by tests/all.sh; needs cc, pkg-config, readelf and redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then
    kill -CONT "$server_pid" 2>/dev/null || true
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "install check: FAILED: $*" >&2; exit 1; }
ok() { echo "install check: ok: $*"; }

version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' Cargo.toml | head -n 1)
prefix="$tmp/prefix"
lib="$prefix/lib"
bash scripts/install.sh --prefix "$prefix"

[ -f "$lib/libredlease.so.$version" ] && [ ! -L "$lib/libredlease.so.$version" ] \
  || fail "no real file $lib/libredlease.so.$version"
[ "$(readlink "$lib/libredlease.so.0")" = "libredlease.so.$version" ] \
  || fail "libredlease.so.0 is not a link to libredlease.so.$version"
[ "$(readlink "$lib/libredlease.so")" = "libredlease.so.0" ] \
  || fail "libredlease.so is not a link to libredlease.so.0"
[ -f "$lib/libredlease.a" ] || fail "no libredlease.a"
cmp -s include/redlease.h "$prefix/include/redlease.h" \
  || fail "the installed header differs from include/redlease.h (run scripts/header.sh)"
ok "files and links in the prefix"

soname=$(readelf -d "$lib/libredlease.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[ "$soname" = "libredlease.so.0" ] || fail "SONAME is '$soname', not libredlease.so.0"
ok "readelf -d: SONAME $soname"

size=$(stat -c %s "$lib/libredlease.so.$version")
[ "$size" -lt $((8 * 1024 * 1024)) ] || fail "the installed shared library is $size bytes: not stripped?"

installed_version=$("$prefix/bin/redlease" --version)
case "$installed_version" in redlease\ *) ;; *) fail "bin/redlease --version: $installed_version" ;; esac
ok "bin/redlease runs ($installed_version)"

export PKG_CONFIG_PATH="$lib/pkgconfig"
[ "$(pkg-config --modversion redlease)" = "$version" ] || fail "pkg-config --modversion"
static_libs=$(pkg-config --static --libs redlease)
case "$static_libs" in *-lredlease*-lpthread*) ;; *) fail "pkg-config --static --libs: $static_libs" ;; esac
ok "pkg-config: redlease $version; --static --libs: $static_libs"

# A server of our own, on a unix socket.
redis-server --port 0 --unixsocket "$tmp/redis.sock" --unixsocketperm 700 --save "" \
  --appendonly no --dir "$tmp" --logfile "$tmp/redis.log" &
server_pid=$!
for _ in $(seq 1 200); do
  [ "$(redis-cli -s "$tmp/redis.sock" ping 2>/dev/null)" = PONG ] && break
  sleep 0.05
done
[ "$(redis-cli -s "$tmp/redis.sock" ping 2>/dev/null)" = PONG ] || fail "redis-server did not start"
export REDIS_URL="redis+unix://$tmp/redis.sock" REDIS_PID="$server_pid"

cflags=(-std=c99 -pedantic -Wall -Wextra -Werror -pthread)

# Shared: pkg-config --cflags --libs, the library found through LD_LIBRARY_PATH.
# shellcheck disable=SC2046
cc "${cflags[@]}" tests/install_check.c $(pkg-config --cflags --libs redlease) \
  -o "$tmp/check_shared"
readelf -d "$tmp/check_shared" | grep -q 'NEEDED.*\[libredlease\.so\.0\]' \
  || fail "the program does not load libredlease.so.0 by its SONAME"
LD_LIBRARY_PATH="$lib" "$tmp/check_shared" || fail "the program linked with the shared library"
ok "shared: cc \$(pkg-config --cflags --libs redlease), NEEDED libredlease.so.0, ran"

# Static: a prefix with only libredlease.a, so -lredlease can only mean the archive.
bash scripts/install.sh --prefix "$tmp/static" --no-shared --no-cli
export PKG_CONFIG_PATH="$tmp/static/lib/pkgconfig"
# shellcheck disable=SC2046
cc "${cflags[@]}" tests/install_check.c $(pkg-config --static --cflags --libs redlease) \
  -o "$tmp/check_static"
if readelf -d "$tmp/check_static" | grep -q 'NEEDED.*libredlease'; then
  fail "the static build still loads libredlease dynamically"
fi
"$tmp/check_static" || fail "the program linked with the static library"
ok "static: cc \$(pkg-config --static --cflags --libs redlease), no libredlease NEEDED, ran"
