"""What `rollout resume` needs to reconnect to a run's fleet, kept beside its journal.

Written whole (temporary file, fsync, rename, directory fsync) before the run's journal
exists, so a run that can be resumed always has one; read back with every field checked,
so a missing or damaged file is a clear error rather than a traceback.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.run.errors import InvocationUnreadable
from rollout.run.files import INVOCATION_FILE
from rollout.run.records import parse_json_object


@dataclass(frozen=True)
class Invocation:
    """The plan file's text and where the fleet is: the inventory and the cluster."""

    spec_source: str
    spec_text: str
    inventory: str
    kubeconfig: str | None
    context: str | None
    accept_new_host_keys: bool

    def to_json(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> Invocation:
        """Parse invocation.json; ValueError says what is wrong with it."""
        try:
            doc = parse_json_object(data)
        except ValueError as e:
            raise ValueError(f"is {e}; it was cut short or edited") from None
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = doc.get(f.name)
            if f.name not in doc:
                raise ValueError(f"has no {f.name!r}")
            if not _has_type(value, str(f.type)):
                raise ValueError(f"has {f.name} = {value!r}, expected {f.type}")
            values[f.name] = value
        return cls(**values)


def _has_type(value: object, annotation: str) -> bool:
    if annotation == "bool":
        return isinstance(value, bool)
    if annotation == "str":
        return isinstance(value, str)
    if annotation == "str | None":
        return value is None or isinstance(value, str)
    raise AssertionError(f"no check for {annotation}")


def read_invocation(run_dir: Path, run_id: str) -> Invocation:
    """The run's invocation; InvocationUnreadable says which run, which file, what to do."""
    path = run_dir / INVOCATION_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvocationUnreadable(run_id, path, "is missing") from None
    except OSError as e:
        raise InvocationUnreadable(run_id, path, f"cannot be read ({e.strerror})") from None
    try:
        return Invocation.from_json(data)
    except ValueError as e:
        raise InvocationUnreadable(run_id, path, str(e)) from None
