#!/usr/bin/env bash
# Every check and test: Rust lints and docs, the generated C header, the Rust tests and the
# C tests (ASan/UBSan and valgrind) against real redis-server processes.
# Installs what it needs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
REDLEASE_DEPS="tls c" source .ci/deps.sh

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo build (regenerates include/redlease.h)"
cargo build --quiet
step "the committed header matches the code"
if [ -d .git ] && ! git diff --exit-code -- include/redlease.h; then
  echo "include/redlease.h differs from what build.rs generates: commit the new header" >&2
  exit 1
fi
step "cargo clippy"
cargo clippy --quiet --all-targets -- -D warnings
step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
step "cargo test (Rust and C tests)"
cargo test
