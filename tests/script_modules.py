"""Scripts of the repository that are not modules of a package (the lab's data scripts, which
have no .py ending; bench's), loaded as modules so unit tests can call their functions."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from importlib import resources
from pathlib import Path
from types import ModuleType


def import_script(path: Path | str, name: str) -> ModuleType:
    """The script at `path` run as a fresh module called `name` (its ending does not matter)."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def import_lab_script(file_name: str, name: str) -> ModuleType:
    """One of the scripts the lab installs on its nodes (rollout/lab/data/<file_name>)."""
    return import_script(str(resources.files("rollout.lab").joinpath("data", file_name)), name)
