"""The undo of `containerd.write`: files back, containerd restarted, judged by what it loads.

Every file rollout replaced is restored from its backup byte for byte, proven by sha256,
except the NVIDIA toolkit's drop-in (TOOLKIT_DROP_IN), which the toolkit writes when its pod
starts and deletes when it stops, at any instant and without asking. For that file a
byte-for-byte proof would judge another writer's bytes: rollout puts its backup back over
the file if the file is still there, leaves it absent if the toolkit has removed it (the
toolkit writes it again from the effective config when its pod next starts), and accepts
whatever the toolkit writes after the restore.

The undo is then judged by what containerd loads after its restart (the real `containerd
config dump`), not by that file's bytes: every setting the write changed holds its value
from before the write, and every runtime handler present before is present again, except
the toolkit's own handlers while its drop-in is absent (they come back with it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollout import containerd as engine
from rollout.containerd.runtimehandlers import list_runtime_handlers
from rollout.containerd.staging import remove_stages
from rollout.containerd.synthesis import TOOLKIT_RUNTIMES
from rollout.plan import FileChange
from rollout.steps.backup import (
    BackupRecord,
    SharedRestore,
    read_node_files,
    remove_empty_dirs,
    remove_file,
    restore_file,
    restore_shared_file,
)
from rollout.steps.base import StepContext, StepFailed
from rollout.steps.systemd import restart_service, written_at_of

# The drop-in the toolkit owns (gpu-operator's DefaultContainerdDropInConfigFile).
TOOLKIT_DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
_UNSET = object()


def judge_undo(
    before: Mapping[str, Any],
    written: Mapping[str, Any],
    live: Mapping[str, Any],
    handlers_before: Sequence[str],
    toolkit_drop_in_absent: bool,
) -> list[str]:
    """What containerd loads after an undo that it did not load before the write: a setting
    the write changed that kept its new value, a runtime handler gone. `before` and
    `written` are the effective configs before and as predicted after the write."""
    problems: list[str] = []
    for change in engine.diff_effective(before, written):
        now = engine.find_value(live, change.path, _UNSET)
        was = engine.find_value(before, change.path, _UNSET)
        if now != was:
            shown = "absent" if was is _UNSET else repr(was)
            found = "absent" if now is _UNSET else repr(now)
            problems.append(f"{change.dotted} is {found}, not {shown} as before the write")
    handlers = set(list_runtime_handlers(live))
    excused = set(TOOLKIT_RUNTIMES) if toolkit_drop_in_absent else set()
    missing = [h for h in handlers_before if h not in handlers and h not in excused]
    if missing:
        problems.append(f"runtime handler(s) present before are gone: {', '.join(missing)}")
    return problems


def restore_files(
    ctx: StepContext,
    kind: str,
    planned: Sequence[FileChange],
    backups: Mapping[str, BackupRecord],
) -> tuple[bool, list[str]]:
    """Each planned file back as it was; whether any file changed, and what the toolkit did
    to its drop-in meanwhile (said, not failed on)."""
    runner = ctx.runner
    current = read_node_files(runner, [f.path for f in planned])
    changed = False
    notes: list[str] = []
    for change in planned:
        now = current.get(change.path)
        if change.before is None:
            if now is not None:
                remove_file(runner, change.path)
                changed = True
        elif change.path in backups and change.path == TOOLKIT_DROP_IN:
            outcome = restore_shared_file(runner, backups[change.path])
            changed = changed or now != change.before
            if outcome is not SharedRestore.RESTORED:
                notes.append(f"{change.path} {outcome.value}")
        elif change.path in backups:
            restore_file(runner, backups[change.path])
            changed = changed or now != change.before
        elif now != change.before:
            raise StepFailed(
                ctx.node,
                kind,
                f"undo: {change.path} is not the original and this run recorded no "
                "backup of it; restore it by hand",
            )
    return changed, notes


def undo_files(
    ctx: StepContext,
    kind: str,
    planned: Sequence[FileChange],
    backups: Mapping[str, BackupRecord],
    data: Mapping[str, Any],
) -> list[str] | None:
    """Restore the files and restart containerd if it may have read them; None when nothing
    was replaced (no restart), else what the toolkit did to its drop-in meanwhile."""
    runner = ctx.runner
    changed, notes = restore_files(ctx, kind, planned, backups)
    remove_empty_dirs(runner, list(data.get("created_dirs", [])))
    remove_stages(runner, ctx.run_id)
    if not changed and written_at_of(data) is None:
        return None  # no file was replaced and no restart could have read one
    timeout_s = float(ctx.spec.policy.verify.containerd_restart_timeout_s)
    restart_service(runner, timeout_s, sleep=ctx.sleep)
    return notes


def toolkit_drop_in_absent(ctx: StepContext) -> bool:
    return read_node_files(ctx.runner, [TOOLKIT_DROP_IN]).get(TOOLKIT_DROP_IN) is None
