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

_lock = threading.Lock()
_loaded: Protocol | None = None


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


def load_protocol() -> Protocol:
    """The CRI modules, imported once; CriUnavailable says what to run when missing."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _import(protocol_dir())
        return _loaded


def _import(directory: Path) -> Protocol:
    if not (directory / "api_pb2_grpc.py").is_file():
        raise CriUnavailable(
            f"the compiled CRI API is missing ({directory / 'api_pb2_grpc.py'}): "
            "run scripts/fetch-cri-api (or scripts/setup --lab)"
        )
    try:
        grpc = importlib.import_module("grpc")
    except ImportError as error:
        raise CriUnavailable(
            "grpc is not installed: install rollout's lab extras (pip install -e '.[lab]')"
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
