#!/usr/bin/env bash
# The C header: regenerates include/redlease.h from src/ffi, or checks it.
#
#   scripts/header.sh           build, then copy the generated header to include/redlease.h
#   scripts/header.sh --check   build, then fail if include/redlease.h differs from it
#
# build.rs writes the header only into cargo's OUT_DIR (never into the source tree); this
# script asks cargo where that is. The committed header is the C API's documentation, so
# commit it whenever src/ffi changes (the test command runs --check).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=write
case "${1:-}" in
  --check) mode=check ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# cargo reports the build script's OUT_DIR in its JSON messages (also when nothing had
# to be rebuilt).
out_dir=$(cargo build --quiet --lib -p redlease --message-format=json \
  | grep '"reason":"build-script-executed"' \
  | grep '"package_id":"[^"]*#redlease@' \
  | sed -n 's/.*"out_dir":"\([^"]*\)".*/\1/p' | tail -n 1)
generated="$out_dir/redlease.h"
if [ -z "$out_dir" ] || [ ! -f "$generated" ]; then
  echo "$0: cargo did not report the header build.rs generated" >&2
  exit 1
fi

if [ "$mode" = check ]; then
  if ! diff -u include/redlease.h "$generated"; then
    echo "include/redlease.h differs from what build.rs generates: run scripts/header.sh" \
         "and commit the new header" >&2
    exit 1
  fi
  echo "include/redlease.h matches the code"
else
  cp "$generated" include/redlease.h
  echo "include/redlease.h regenerated from src/ffi"
fi
