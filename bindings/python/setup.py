"""Builds the redlease wheel: this ctypes package plus libredlease.so, which setuptools-rust
builds with cargo from the Rust crate.

Where the crate is:
- in a source checkout, at the repository root (``../../Cargo.toml``);
- in an sdist, in its ``rust/`` folder: the sdist carries the crate as ``cargo package``
  ships it (sources, build script, header, ``Cargo.lock``), so it builds from its own files.
  Its dependencies are not in it: cargo fetches them from crates.io (or from a vendored
  directory that a ``.cargo/config.toml`` names).

The wheel is tagged ``py3-none-<platform>``: the package is pure Python loading a C library
with ctypes, so it runs on any Python 3 (no CPython extension module, no abi3), but only on
the platform the library was built for. The bundled library is stripped.
"""

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.sdist import sdist
from setuptools_rust import Binding, RustExtension, Strip
from setuptools_rust.build import build_rust

HERE = Path(__file__).resolve().parent
BUNDLED_CRATE = HERE / "rust"
REPOSITORY = HERE.parents[1]
LIB_NAME = "libredlease.so"


def crate_manifest() -> str:
    """The crate's Cargo.toml, relative to this directory (setuptools wants relative paths)."""
    if (BUNDLED_CRATE / "Cargo.toml").is_file():
        return "rust/Cargo.toml"
    if (REPOSITORY / "Cargo.toml").is_file() and (REPOSITORY / "src" / "ffi").is_dir():
        return os.path.relpath(REPOSITORY / "Cargo.toml", HERE)
    raise SystemExit(
        "redlease: the Rust crate is neither in rust/ (an sdist) nor at ../../ (a checkout)"
    )


class BuildRust(build_rust):
    """Names the bundled library libredlease.so, as the package loads it (setuptools-rust
    would name it like a CPython extension module, libredlease.cpython-3XX-....so)."""

    def get_dylib_ext_path(self, ext: RustExtension, target_fname: str) -> str:
        path = super().get_dylib_ext_path(ext, target_fname)
        return os.path.join(os.path.dirname(path), LIB_NAME)


class WheelForAnyPython3(bdist_wheel):
    """py3-none-<platform>: any Python 3, this platform only."""

    def get_tag(self):  # type: ignore[no-untyped-def]
        _python, _abi, plat = super().get_tag()
        return "py3", "none", plat


class SdistWithCrate(sdist):
    """Puts the crate in the sdist's rust/ folder: the files ``cargo package`` ships (its
    normalized Cargo.toml, made a workspace of its own, and Cargo.lock)."""

    def make_release_tree(self, base_dir: str, files: "list[str]") -> None:
        super().make_release_tree(base_dir, files)
        dest = Path(base_dir) / "rust"
        if (BUNDLED_CRATE / "Cargo.toml").is_file():  # an sdist made from an sdist
            shutil.copytree(BUNDLED_CRATE, dest, ignore=shutil.ignore_patterns("target"))
            return
        manifest = REPOSITORY / "Cargo.toml"
        # --allow-dirty: the sdist is made from the working tree as it is; --no-verify: the
        # wheel build compiles it anyway.
        subprocess.check_call(
            ["cargo", "package", "--quiet", "--allow-dirty", "--no-verify", "-p", "redlease",
             "--manifest-path", str(manifest)]
        )
        metadata = subprocess.check_output(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--manifest-path", str(manifest)]
        )
        import json

        meta = json.loads(metadata)
        version = next(p["version"] for p in meta["packages"] if p["name"] == "redlease")
        crate = Path(meta["target_directory"]) / "package" / f"redlease-{version}.crate"
        prefix = f"redlease-{version}/"
        with tarfile.open(crate, "r:gz") as archive:
            for member in archive.getmembers():
                if not member.isfile() or not member.name.startswith(prefix):
                    continue
                target = dest / member.name[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                assert source is not None
                target.write_bytes(source.read())
        cargo_toml = dest / "Cargo.toml"
        with io.open(cargo_toml, "a", encoding="utf-8") as f:
            f.write("\n# Added by bindings/python/setup.py: the crate is a workspace of its own here.\n")
            f.write("[workspace]\n")


setup(
    rust_extensions=[
        RustExtension(
            "redlease.libredlease",
            path=crate_manifest(),
            binding=Binding.NoBinding,
            # Stripped by the linker (symbols and debug information; the exported functions
            # stay in the dynamic symbol table). Strip.All would leave a symbol table.
            rustc_flags=["-Cstrip=symbols"],
            strip=Strip.No,
            # Only the C library: neither the CLI nor anything else of the workspace.
            args=["-p", "redlease"],
        )
    ],
    cmdclass={"build_rust": BuildRust, "bdist_wheel": WheelForAnyPython3, "sdist": SdistWithCrate},
    zip_safe=False,
)
