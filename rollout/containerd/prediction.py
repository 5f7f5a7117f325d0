"""Prediction: the real `containerd config dump` before and after the writes, on the node.

Runs only through a CommandRunner, so it works over SSH as well as locally. The effective
diff of the two dumps must be exactly the intent: every changed leaf lies under an intended
path, and every intended path holds the intended value afterwards. Anything else refuses the
change, naming the keys that would change or vanish.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rollout.commands import CommandRunner
from rollout.containerd.diff import Change, diff_effective, format_path
from rollout.containerd.errors import PredictionRefused
from rollout.containerd.files import ConfigFiles
from rollout.containerd.intent import Intent, PlacedSetting, place_intent
from rollout.containerd.merge import find_value
from rollout.containerd.staging import dump_configs
from rollout.containerd.synthesis import FileWrite, apply_writes
from rollout.containerd.version import ContainerdVersion

_MISSING = object()


@dataclass(frozen=True)
class Prediction:
    """The real effective configs before and after, and their differences (all intended)."""

    before: Mapping[str, Any]
    after: Mapping[str, Any]
    changes: tuple[Change, ...]
    placed: tuple[PlacedSetting, ...]

    @property
    def is_noop(self) -> bool:
        return not self.changes


def predict(
    runner: CommandRunner,
    containerd_bin: str,
    files: ConfigFiles,
    writes: Iterable[FileWrite],
    intent: Intent,
    version: ContainerdVersion,
    restoring: Iterable[tuple[str, ...]] = (),
    *,
    owner: str = "",
) -> Prediction:
    """Dump the staged files before and after `writes`; refuse unless the change is the intent.

    `restoring` names tables a repair gives back (see repair_scope): under them keys may only
    come back, never change or vanish. `owner` names the staging directory (see staging).
    """
    candidate = apply_writes(files, writes)
    before, after = dump_configs(runner, containerd_bin, [files, candidate], owner=owner)
    config_version = after.get("version", 2)
    placed = place_intent(intent, version, config_version if isinstance(config_version, int) else 2)
    changes = tuple(diff_effective(before, after))
    check_prediction(changes, after, placed, runner.host, restoring)
    return Prediction(before, after, changes, placed)


def check_prediction(
    changes: Iterable[Change],
    after: Mapping[str, Any],
    placed: Iterable[PlacedSetting],
    host: str,
    restoring: Iterable[tuple[str, ...]] = (),
) -> None:
    """Raise PredictionRefused unless the changes are the placed settings (and restorations)."""
    placed = tuple(placed)
    restored = tuple(restoring)
    extra = [
        c
        for c in changes
        if not any(c.path[: len(s.path)] == s.path for s in placed)
        and not (c.before is None and any(c.path[: len(r)] == r for r in restored))
    ]
    unmet = [s for s in placed if _get(after, s.path) != s.value]
    if not extra and not unmet:
        return
    lines = []
    for change in extra:
        what = "would vanish" if change.after is None else "would change"
        lines.append(f"  {format_path(change.path)} {what}: {change}")
    for setting in unmet:
        got = _get(after, setting.path)
        shown = "absent" if got is _MISSING else repr(got)
        lines.append(
            f"  {format_path(setting.path)} would be {shown}, not the intended {setting.value!r}"
        )
    raise PredictionRefused(
        f"the real `containerd config dump` on {host} differs from the intent "
        f"({len(extra)} unintended change(s), {len(unmet)} intended value(s) not reached):\n"
        + "\n".join(lines)
        + "\n  nothing was written; check for drop-ins that shadow the CRI table"
    )


def _get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    return find_value(tree, path, _MISSING)
