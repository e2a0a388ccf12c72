#!/usr/bin/env bash
# Every check and test: Rust lints and docs, the generated C header, the Rust tests, the C
# tests (ASan/UBSan and valgrind) and the Python tests, against real redis-server processes.
# Installs what it needs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
REDLEASE_DEPS="tls c python" source .ci/deps.sh

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

step "demo (short run: 3 workers x 5 jobs)"
cargo run --quiet --release --example demo -- 3 5

step "benchmark smoke run (a few seconds; figures are not checked)"
cargo build --quiet --release --lib
cargo run --quiet --release --example bench -- --smoke \
  || { echo "the benchmark smoke run failed" >&2; exit 1; }

step "Python: pip install ./bindings/python (builds and bundles libredlease.so), then pytest"
python3 -m venv target/venv
target/venv/bin/pip install --quiet --disable-pip-version-check pytest redis ./bindings/python
# Run the installed package (not the source tree) from outside the package directory.
status=0
REDLEASE_EXPECT_INSTALLED=1 target/venv/bin/pytest -q -p no:cacheprovider bindings/python/tests || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
fi
exit "$status"
