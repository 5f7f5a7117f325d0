"""setuptools' build hooks (the project itself is declared in pyproject.toml): a wheel or an
sdist built from a git checkout records the checkout's commit in rollout/build.json, which
`rollout version` reports once installed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

PACKAGE = Path(__file__).resolve().parent / "rollout"


def version_module() -> ModuleType:
    """rollout/version.py, loaded by its path: rollout's dependencies are not installed here."""
    spec = importlib.util.spec_from_file_location("rollout_build_version", PACKAGE / "version.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install runs from the checkout: git tells
            version_module().record_build(PACKAGE, Path(self.build_lib) / "rollout")


class Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        version_module().record_build(PACKAGE, Path(base_dir) / "rollout")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
