#!/usr/bin/env bash
# Builds redlease in release mode and installs it like a C library:
#
#   PREFIX/lib/libredlease.so.X.Y.Z          the shared library, SONAME libredlease.so.N
#   PREFIX/lib/libredlease.so.N -> .so.X.Y.Z the name programs load
#   PREFIX/lib/libredlease.so   -> .so.N     the name the linker finds (-lredlease)
#   PREFIX/lib/libredlease.a                 the static library
#   PREFIX/lib/pkgconfig/redlease.pc         pkg-config: --cflags, --libs, --static --libs
#   PREFIX/include/redlease.h                the header
#   PREFIX/bin/redlease                      the command-line tool
#
# Usage: scripts/install.sh [--prefix DIR] [--libdir DIR] [--includedir DIR] [--bindir DIR]
#                           [--no-shared] [--no-static] [--no-cli] [--no-strip]
#   --prefix DIR   where to install (default /usr/local)
#   --libdir DIR, --includedir DIR, --bindir DIR
#                  override PREFIX/lib, PREFIX/include, PREFIX/bin
#   --no-shared    no shared library (with only libredlease.a in the libdir, -lredlease
#                  links statically: `cc app.c $(pkg-config --static --cflags --libs redlease)`)
#   --no-static    no static library
#   --no-cli       do not build or install the redlease command
#   --no-strip     keep the debug information (the release profile has some)
#   DESTDIR=/stage scripts/install.sh ...   stages the files under /stage (for packagers);
#                  redlease.pc still names the final paths
#
# Needs cargo, and readelf (binutils) to read the SONAME back. Libs.private in redlease.pc is
# what rustc reports for the static library (--print native-static-libs), not a copied list.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
libdir="" includedir="" bindir=""
shared=1 static=1 cli=1 strip=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --libdir) libdir="$2"; shift 2 ;;
    --libdir=*) libdir="${1#*=}"; shift ;;
    --includedir) includedir="$2"; shift 2 ;;
    --includedir=*) includedir="${1#*=}"; shift ;;
    --bindir) bindir="$2"; shift 2 ;;
    --bindir=*) bindir="${1#*=}"; shift ;;
    --no-shared) shared=0; shift ;;
    --no-static) static=0; shift ;;
    --no-cli) cli=0; shift ;;
    --no-strip) strip=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "$0: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
absolute() { case "$1" in /*|"") printf '%s' "$1" ;; *) printf '%s/%s' "$(pwd -P)" "$1" ;; esac; }
prefix=$(absolute "$prefix"); prefix="${prefix%/}"
libdir=$(absolute "$libdir"); includedir=$(absolute "$includedir"); bindir=$(absolute "$bindir")
# pkg-config variables: relative to ${prefix} where they are under it.
pc_libdir='${exec_prefix}/lib' pc_includedir='${prefix}/include'
if [ -n "$libdir" ]; then pc_libdir="$libdir"; else libdir="$prefix/lib"; fi
if [ -n "$includedir" ]; then pc_includedir="$includedir"; else includedir="$prefix/include"; fi
[ -n "$bindir" ] || bindir="$prefix/bin"
dest="${DESTDIR:-}"

say() { printf 'install.sh: %s\n' "$*" >&2; }

version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || { say "no version in Cargo.toml"; exit 1; }

# The command first: building it rebuilds the library without a SONAME (as a dependency, with
# REDLEASE_SONAME unset), which must not overwrite the library built below before it is copied.
if [ "$cli" = 1 ]; then
  say "building the redlease command (cargo build --release -p redlease-cli)"
  cli_json=$(cargo build --release -p redlease-cli --message-format=json-render-diagnostics)
  cli_bin=$(printf '%s\n' "$cli_json" | grep '"reason":"compiler-artifact"' \
    | grep '"executable":"[^"]*/redlease"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
  [ -n "$cli_bin" ] && [ -x "$cli_bin" ] || { say "cargo did not build the redlease command"; exit 1; }
  stage_cli=$(mktemp -d)
  cp "$cli_bin" "$stage_cli/redlease"
  cli_bin="$stage_cli/redlease"
fi

# One build gives the libraries, the generated header's location (JSON on stdout) and the
# native libraries a static link needs (a note on stderr, replayed when nothing changed).
log=$(mktemp)
trap 'rm -f "$log"; rm -rf "${stage_cli:-}"' EXIT
say "building the library (cargo rustc --release --lib, REDLEASE_SONAME=1)"
if ! json=$(REDLEASE_SONAME=1 cargo rustc --release --lib -p redlease \
    --message-format=json-render-diagnostics -- --print native-static-libs 2>"$log"); then
  cat "$log" >&2
  say "the build failed"
  exit 1
fi
native_libs=$(sed -n 's/^note: native-static-libs: //p' "$log" | tail -n 1)
[ -n "$native_libs" ] || { cat "$log" >&2; say "rustc did not report native-static-libs"; exit 1; }

artifact() { # the path of the build's output file named $1
  printf '%s\n' "$json" | grep '"reason":"compiler-artifact"' | grep '#redlease@' \
    | grep -o "\"[^\"]*/$1\"" | tr -d '"' | tail -n 1
}
so=$(artifact libredlease.so)
archive=$(artifact libredlease.a)
out_dir=$(printf '%s\n' "$json" | grep '"reason":"build-script-executed"' | grep '#redlease@' \
  | sed -n 's/.*"out_dir":"\([^"]*\)".*/\1/p' | tail -n 1)
header="$out_dir/redlease.h"
for f in "$so" "$archive" "$header"; do
  [ -n "$f" ] && [ -f "$f" ] || { say "the build did not produce ${f:-an expected file}"; exit 1; }
done
if ! cmp -s "$header" include/redlease.h; then
  say "warning: include/redlease.h is not the generated header (scripts/header.sh); installing the generated one"
fi

soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[ -n "$soname" ] || { say "$so has no SONAME (is readelf from binutils installed?)"; exit 1; }
real="libredlease.so.$version"

install -d "$dest$libdir" "$dest$libdir/pkgconfig" "$dest$includedir"
if [ "$shared" = 1 ]; then
  install -m 0755 "$so" "$dest$libdir/$real"
  if [ "$strip" = 1 ]; then strip --strip-unneeded "$dest$libdir/$real"; fi
  ln -sfn "$real" "$dest$libdir/$soname"
  ln -sfn "$soname" "$dest$libdir/libredlease.so"
fi
if [ "$static" = 1 ]; then
  install -m 0644 "$archive" "$dest$libdir/libredlease.a"
  if [ "$strip" = 1 ]; then strip --strip-debug "$dest$libdir/libredlease.a"; fi
fi
install -m 0644 "$header" "$dest$includedir/redlease.h"

description=$(sed -n 's/^description = "\([^"]*\)"$/\1/p' Cargo.toml | head -n 1)
cat >"$dest$libdir/pkgconfig/redlease.pc" <<EOF
prefix=$prefix
exec_prefix=\${prefix}
libdir=$pc_libdir
includedir=$pc_includedir

Name: redlease
Description: $description
Version: $version
Libs: -L\${libdir} -lredlease
Libs.private: $native_libs
Cflags: -I\${includedir}
EOF

if [ "$cli" = 1 ]; then
  install -d "$dest$bindir"
  install -m 0755 "$cli_bin" "$dest$bindir/redlease"
  if [ "$strip" = 1 ]; then strip "$dest$bindir/redlease"; fi
fi

say "installed redlease $version into ${dest}$prefix:"
{
  [ "$shared" = 1 ] && printf '  %s\n' "$libdir/$real" "$libdir/$soname -> $real" \
    "$libdir/libredlease.so -> $soname"
  [ "$static" = 1 ] && printf '  %s\n' "$libdir/libredlease.a"
  printf '  %s\n' "$includedir/redlease.h" "$libdir/pkgconfig/redlease.pc"
  [ "$cli" = 1 ] && printf '  %s\n' "$bindir/redlease"
} >&2 || true
