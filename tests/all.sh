#!/usr/bin/env bash
# Every check and test: Rust lints and docs, the generated C header, the Rust tests, the
# runtime's races under shuttle, the C tests (ASan/UBSan and valgrind), the crate package,
# the C install (pkg-config, shared and static), the Python sdist and wheel and the Python
# tests against the installed wheel, all against real redis-server processes. Installs
# what it needs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
REDLEASE_DEPS="tls c python" source .ci/deps.sh

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo build"
cargo build --quiet
step "the committed header is the one build.rs generates (scripts/header.sh --check)"
bash scripts/header.sh --check
step "cargo clippy"
cargo clippy --quiet --workspace --all-targets -- -D warnings
step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
step "cargo test (Rust and C tests, and the redlease command's)"
cargo test --workspace

# The feature swaps every mutex, condition variable and thread of the runtime for shuttle's
# (src/sync.rs), so only the races tests run with it. REDLEASE_SHUTTLE_SCALE=N explores N
# times as many schedules.
step "the runtime's races under the shuttle scheduler (cargo test --features shuttle)"
cargo clippy --quiet --features shuttle --lib --tests -- -D warnings
cargo test --quiet --features shuttle --lib races::

step "demo (short run: 3 workers x 5 jobs)"
cargo run --quiet --release --example demo -- 3 5

step "benchmark smoke run (a few seconds; figures are not checked)"
cargo build --quiet --release --lib
cargo run --quiet --release --example bench -- --smoke \
  || { echo "the benchmark smoke run failed" >&2; exit 1; }

step "cargo package (the crate builds from the files it ships)"
cargo package --allow-dirty -p redlease 2>&1 \
  | { grep -v '^warning: ignoring .* is not included in the published package' || true; }

step "C install: scripts/install.sh into a temporary prefix, programs built with pkg-config"
bash tests/install_check.sh

step "Python: sdist, then a wheel built from it (setuptools-rust); tag, size, contents"
version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' Cargo.toml | head -n 1)
py=target/python
rm -rf "$py"
mkdir -p "$py/dist"
python3 -m venv "$py/build-venv"
"$py/build-venv/bin/pip" install --quiet --disable-pip-version-check build
# python -m build makes the sdist, then builds the wheel from the unpacked sdist alone.
# CARGO_TARGET_DIR only shares the compiled dependencies; the crate comes from the sdist.
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}" "$py/build-venv/bin/python" -m build --outdir "$py/dist" \
  bindings/python >"$py/build.log" 2>&1 || { cat "$py/build.log" >&2; exit 1; }
platform=$(python3 -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')
wheel="$py/dist/redlease-$version-py3-none-$platform.whl"
sdist="$py/dist/redlease-$version.tar.gz"
ls -l "$py/dist"
[ -f "$wheel" ] || { echo "no wheel tagged py3-none-$platform" >&2; exit 1; }
[ -f "$sdist" ] || { echo "no sdist redlease-$version.tar.gz" >&2; exit 1; }
python3 - "$wheel" "$sdist" <<'EOF'
import subprocess, sys, tarfile, tempfile, zipfile
from pathlib import Path

wheel, sdist = map(Path, sys.argv[1:])
size = wheel.stat().st_size
assert size < 5 * 1024 * 1024, f"the wheel is {size} bytes (limit 5 MiB)"
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    assert "redlease/libredlease.so" in names, names
    assert not [n for n in names if n.endswith(".so") and n != "redlease/libredlease.so"], names
    tags = [l for l in z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode().splitlines()
            if l.startswith("Tag:")]
    assert tags == [f"Tag: {wheel.name.split('-', 2)[2][:-4]}"], tags
    with tempfile.TemporaryDirectory() as d:
        lib = Path(z.extract("redlease/libredlease.so", d))
        sections = subprocess.run(["readelf", "-S", "-W", str(lib)], check=True,
                                  capture_output=True, text=True).stdout
        assert ".debug_" not in sections and ".symtab" not in sections, "the library is not stripped"
with tarfile.open(sdist) as t:
    names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
for needed in ["setup.py", "pyproject.toml", "redlease/__init__.py", "rust/Cargo.toml",
               "rust/Cargo.lock", "rust/build.rs", "rust/src/lib.rs", "rust/src/ffi/mod.rs",
               "rust/include/redlease.h", "rust/LICENSE-MIT", "rust/LICENSE-APACHE"]:
    assert needed in names, f"{needed} is not in the sdist"
print(f"{wheel.name}: {size} bytes, {tags[0]}, stripped library; the sdist carries the crate")
EOF

step "Python: the wheel installed in a fresh venv, then pytest (from outside the package)"
python3 -m venv "$py/venv"
"$py/venv/bin/pip" install --quiet --disable-pip-version-check pytest redis "$wheel"
status=0
REDLEASE_EXPECT_INSTALLED=1 "$py/venv/bin/pytest" -q -p no:cacheprovider bindings/python/tests || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
fi
exit "$status"
