"""What a step keeps for later steps, its undo, or a resumed run: one JSON file per node and step.

``<run>/nodes/<node>/<step>.json``, replaced whole (temporary file, fsync, rename, directory
fsync), so a step that saved something before a crash finds all of it, or none, on resume.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollout.run.errors import JournalError, StepDataUnreadable
from rollout.run.files import NAME_PATTERN, NODES_DIR, make_dirs_durable, replace_file
from rollout.run.records import parse_json_object


def save_step_data(run_dir: Path, node: str, step: str, data: Mapping[str, Any]) -> None:
    """Keep `data` (JSON-serialisable) for this node and step, durably, replacing what was."""
    path = _data_path(run_dir, node, step)
    make_dirs_durable(path.parent)
    replace_file(path, json.dumps(dict(data), sort_keys=True).encode())


def load_step_data(run_dir: Path, node: str, step: str) -> dict[str, Any]:
    """What this node's step saved; {} when it saved nothing."""
    path = _data_path(run_dir, node, step)
    try:
        return parse_json_object(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise StepDataUnreadable(
            f"{path}: the data step {step} saved for {node} cannot be read ({e}); only "
            "rollout writes it: restore it from a backup, or start a new run"
        ) from None


def _data_path(run_dir: Path, node: str, step: str) -> Path:
    for what, name in (("node", node), ("step", step)):
        if not NAME_PATTERN.fullmatch(name):
            raise JournalError(f"{what} name {name!r} cannot name a file under {run_dir}")
    return run_dir / NODES_DIR / node / f"{step}.json"
