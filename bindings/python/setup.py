"""Builds libredlease.so with cargo and bundles it in the package.

The package is a ctypes wrapper; the library is the Rust crate at the repository root.
Set REDLEASE_SKIP_CARGO=1 to bundle nothing (the wrapper then finds the library through
REDLEASE_LIB or the repository's target/ folders).
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


class BuildWithCargo(build_py):
    def run(self):
        super().run()
        if os.environ.get("REDLEASE_SKIP_CARGO"):
            return
        root = Path(__file__).resolve().parents[2]
        if not (root / "Cargo.toml").is_file():
            raise SystemExit(f"redlease: no Cargo.toml at {root}; set REDLEASE_SKIP_CARGO=1")
        subprocess.check_call(["cargo", "build", "--release", "--lib"], cwd=root)
        target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
        dest = Path(self.build_lib) / "redlease"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(target / "release" / "libredlease.so", dest / "libredlease.so")


class BinaryDistribution(Distribution):
    """The wheel carries a native library, so it is platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithCargo}, distclass=BinaryDistribution)
