"""The compiled CRI protocol (api_pb2, api_pb2_grpc) and grpc, loaded from the cache.

scripts/fetch-cri-api compiles Debian's runtime/v1 api.proto into <cache>/cri-api/python; the
modules are generated code without type information, so they are handed out as Any.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.containerd.binaries import cache_dir
from rollout.errors import RolloutError

# How to install the `lab` extra (pyproject.toml) that holds grpc and protobuf.
INSTALL_LAB_EXTRA = "pip install 'gpu-rollout[lab]' (in a checkout: scripts/setup --lab)"
FETCH_CRI_API = "run scripts/fetch-cri-api from rollout's source (or scripts/setup --lab)"

_lock = threading.Lock()
# directory -> its protocol, imported once
_loaded: dict[Path, Protocol] = {}


class CriUnavailable(RolloutError):
    """The compiled CRI protocol or grpc is missing on this machine."""


@dataclass(frozen=True)
class Protocol:
    """grpc and the CRI messages and stubs."""

    grpc: Any
    api: Any
    services: Any


def protocol_dir() -> Path:
    return cache_dir() / "cri-api" / "python"


def load_protocol(directory: Path | None = None) -> Protocol:
    """The CRI modules of `directory` (the cache's by default), imported once;
    CriUnavailable says what to run when missing."""
    where = directory or protocol_dir()
    with _lock:
        if where not in _loaded:
            _loaded[where] = _import(where)
        return _loaded[where]


def missing_protocol_file(directory: Path) -> Path | None:
    """The compiled module `directory` lacks, or None when both are there."""
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        if not (directory / name).is_file():
            return directory / name
    return None


def _import(directory: Path) -> Protocol:
    missing = missing_protocol_file(directory)
    if missing is not None:
        raise CriUnavailable(f"the compiled CRI API is missing ({missing}): {FETCH_CRI_API}")
    try:
        grpc = importlib.import_module("grpc")
    except ImportError as error:
        raise CriUnavailable(
            f"grpc is not installed ({error}): install rollout's lab extra: {INSTALL_LAB_EXTRA}"
        ) from error
    api = _import_file("api_pb2", directory / "api_pb2.py")
    services = _import_file("api_pb2_grpc", directory / "api_pb2_grpc.py")
    return Protocol(grpc=grpc, api=api, services=services)


def _import_file(name: str, path: Path) -> Any:
    """Import a generated module under its own name (api_pb2_grpc imports `api_pb2`)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CriUnavailable(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # generated code against another protobuf runtime
        del sys.modules[name]
        raise CriUnavailable(
            f"{path} does not import ({error}); remove {path.parent} and run scripts/fetch-cri-api"
        ) from error
    return module
