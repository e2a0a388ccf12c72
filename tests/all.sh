#!/usr/bin/env bash
# Every check and test: Rust lints and docs, the Rust tests against real redis-server
# processes. Installs what it needs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
REDLEASE_DEPS="tls" source .ci/deps.sh

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --all-targets -- -D warnings
step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
step "cargo test"
cargo test
