"""Steps `containerd.write` and `containerd.verify`: the node side of a containerd change.

`containerd.write` replaces the planned files only after three checks on the node itself:
the files are still what the plan read (else the plan is stale), the real `containerd config
dump` of staged copies changes exactly the intent (invariant 1), and every file it replaces
is backed up first (invariant 6). `containerd.verify` runs after `systemd.restart` and checks
the real dump against the prediction and that no runtime handler vanished (invariant 2).

Saved data of `containerd.write` (StepContext.save_data), read by the later steps and undo:

- before_dump / after_dump: the effective config before and as predicted (secrets redacted);
- handlers_before: the runtime handlers of before_dump;
- created_dirs: directories that did not exist before, so undo deletes them;
- written_at: node-clock time the last file was replaced (absent until then).

The steps read the node through rollout.facts, as the plan did. Transient errors (an SSH
drop) go to the retry policy: a retry rereads and skips what is done. Staging dirs carry
the run id, so a retry or resume removes what a killed attempt left, never another run's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rollout import containerd as engine
from rollout.changes.base import PlanningContext
from rollout.changes.containerd.writes import ContainerdWork, build_intent, parent_directories
from rollout.commands import CommandRunner
from rollout.containerd.runtimehandlers import list_runtime_handlers
from rollout.containerd.staging import remove_stages
from rollout.errors import RolloutError
from rollout.facts import (
    CONTAINERD_BIN,
    ConfigDumpFact,
    ConfigFilesFact,
    ContainerdVersionFact,
    NodeFacts,
    check_containerd_version,
    read_fact,
)
from rollout.plan import FileChange, StepPlan
from rollout.run import BackupWritten
from rollout.secrets import redact_value
from rollout.steps.backup import (
    BackupRecord,
    back_up_file,
    backup_path_for,
    find_missing_dirs,
    replace_file,
    sha256_of_files,
)
from rollout.steps.base import StepContext, StepFailed, StepResult, translate_step_errors
from rollout.steps.containerd_undo import judge_undo, toolkit_drop_in_absent, undo_files
from rollout.steps.nodechanges import WRITE_STEP, ContainerdFileStep
from rollout.steps.systemd import (
    probe_service,
    read_node_clock,
    written_at_of,
)
from rollout.steps.traits import StepTraits, bounded_by_requests

DIFF_LINES = 12


# --- pure decisions ----------------------------------------------------------------------------


def classify_files(
    planned: Sequence[FileChange], current: Mapping[str, str | None]
) -> tuple[list[FileChange], list[FileChange], list[FileChange]]:
    """Split planned files into (still original, already written, changed by someone else)."""
    original: list[FileChange] = []
    written: list[FileChange] = []
    drifted: list[FileChange] = []
    for change in planned:
        now = current.get(change.path)
        if now == change.after:
            written.append(change)
        elif now == change.before:
            original.append(change)
        else:
            drifted.append(change)
    return original, written, drifted


def describe_drift(change: FileChange, now: str | None) -> str:
    """One drifted file: what the plan read, what is there now, as a short diff."""
    if now is None:
        return f"{change.path} was removed since the plan"
    if change.before is None:
        return f"{change.path} was created since the plan (the plan creates it)"
    diff = FileChange(change.path, change.before, now, "").unified_diff().splitlines()
    shown = diff[2 : 2 + DIFF_LINES]
    more = (
        f"\n    ... {len(diff) - 2 - DIFF_LINES} more line(s)" if len(diff) > 2 + DIFF_LINES else ""
    )
    return (
        f"{change.path} differs from what the plan read:\n"
        + "\n".join(f"    {line}" for line in shown)
        + more
    )


def as_saved(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A dump as save_data stores it (JSON, registry credentials redacted: invariant 9), so
    a saved and a fresh dump compare equal."""
    loaded: dict[str, Any] = json.loads(
        json.dumps(redact_value((), tree), sort_keys=True, default=str)
    )
    return loaded


def describe_dump_difference(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> str:
    """The leaves of `actual` that differ from `expected`, a few lines at most."""
    changes = engine.diff_effective(dict(expected), dict(actual))
    lines = [f"  {engine.format_path(c.path)}: {c}" for c in changes[:DIFF_LINES]]
    if len(changes) > DIFF_LINES:
        lines.append(f"  ... {len(changes) - DIFF_LINES} more")
    return "\n".join(lines) or "  (no leaf differs; the trees differ in shape)"


# --- node reads --------------------------------------------------------------------------------


def read_live_dump(runner: CommandRunner, main_path: str) -> dict[str, Any]:
    """The dump fact of the node's real files, as save_data stores it."""
    return as_saved(read_fact(runner, ConfigDumpFact(main_path)))


def remove_run_stages(runners: Mapping[str, CommandRunner], run_id: str) -> dict[str, str]:
    """Remove what `run_id` staged on each node; {node: why not} for those it could not reach.

    The end of a run calls it: staging dirs a killed attempt left behind go with the run.
    """
    problems: dict[str, str] = {}
    for node, runner in runners.items():
        try:
            remove_stages(runner, run_id)
        except RolloutError as exc:
            problems[node] = str(exc)
    return problems


def read_config_files(
    runner: CommandRunner, main_path: str, planned: Sequence[FileChange]
) -> engine.ConfigFiles:
    """The node's files under /etc/containerd, as the facts read them, and each planned file
    wherever it lies (a hosts.toml under a config_path elsewhere; absent ones left out), in
    one round trip."""
    return read_fact(runner, ConfigFilesFact(main_path, also=tuple(f.path for f in planned)))


def with_planned_before(
    files: engine.ConfigFiles, planned: Sequence[FileChange]
) -> engine.ConfigFiles:
    """The node's files as the plan read them: each planned file at its `before` text.

    Predicting from this set (rather than from the node as found) gives the same prediction
    on a first attempt and on a resumed one that finds some files already written.
    """
    out = files
    for change in planned:
        if change.before is None:
            out = out.without_file(change.path)
        else:
            out = out.with_file(change.path, change.before)
    return out


def recorded_backups(ctx: StepContext) -> dict[str, BackupRecord]:
    """The backups this run's journal holds for the node's planned files, latest per path."""
    planned = {f.path for f in ctx.node_plan.files}
    found: dict[str, BackupRecord] = {}
    for backup in ctx.journal.replay().node(ctx.node).backups:
        if backup.path in planned:
            found[backup.path] = BackupRecord(backup.path, backup.backup_path, backup.sha256)
    return found


def backups_on_node(runner: CommandRunner, backups: Mapping[str, BackupRecord]) -> set[str]:
    """The paths whose recorded backup is still on the node with its recorded bytes."""
    sums = sha256_of_files(runner, [b.backup_path for b in backups.values()])
    return {path for path, b in backups.items() if sums.get(b.backup_path) == b.sha256}


# --- steps -------------------------------------------------------------------------------------


class ContainerdWrite:
    """Write the planned containerd files, after a drift check, a prediction and backups."""

    kind: ClassVar[str] = WRITE_STEP
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=(),
        expected_s=3.0,
        worst_s=bounded_by_requests,
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        changes = ctx.work_as(facts, "containerd", ContainerdWork, ContainerdWork()).containerd
        files = changes.files
        if not files:
            reasons = ("the effective containerd config already holds the intent",)
            return StepPlan.skipping(self.kind, "; ".join(reasons + changes.unchanged))
        return StepPlan.acting(self.kind, "write " + ", ".join(f.path for f in files))

    def apply(self, ctx: StepContext) -> StepResult:
        planned = list(ctx.node_plan.files)
        if not planned:
            return StepResult.noop("the effective containerd config already holds the intent")
        removals = [f.path for f in planned if f.after is None]
        if removals:
            raise self._fail(ctx, f"removing files is not supported: {', '.join(removals)}")
        with translate_step_errors(ctx.node, self.kind):
            return self._apply(ctx, planned)

    def _apply(self, ctx: StepContext, planned: list[FileChange]) -> StepResult:
        runner = ctx.runner
        # the one read of the node's files: the drift check and the prediction both use it
        files = read_config_files(runner, ctx.facts.config_files.main_path, planned)
        current = {f.path: files.files.get(f.path) for f in planned}
        original, written, drifted = classify_files(planned, current)
        if drifted:
            raise self._fail(
                ctx,
                "node changed since the plan; nothing was written:\n  "
                + "\n  ".join(describe_drift(f, current.get(f.path)) for f in drifted)
                + "\n  run `rollout plan` again and review the new diff",
            )
        saved = ctx.load_data(self.kind)
        if not original and saved.get("after_dump") is not None:
            return StepResult.noop("already written: " + ", ".join(f.path for f in planned))
        backups = recorded_backups(ctx)
        unbacked = [f.path for f in written if f.before is not None and f.path not in backups]
        if unbacked:
            raise self._fail(
                ctx,
                f"{', '.join(unbacked)} already hold(s) the planned content but this run "
                "recorded no backup of the original; rollout did not write it, so it "
                "cannot roll it back: run `rollout plan` again",
            )
        prediction = self._predict(ctx, files, planned)
        handlers_before = list_runtime_handlers(prediction.before)
        new_dirs = sorted(
            {d for f in original if f.before is None for d in parent_directories(f.path)}
        )
        created_dirs = sorted(
            set(find_missing_dirs(runner, new_dirs)) | set(saved.get("created_dirs", []))
        )
        data: dict[str, Any] = {
            "before_dump": as_saved(prediction.before),
            "after_dump": as_saved(prediction.after),
            "handlers_before": list(handlers_before),
            "created_dirs": created_dirs,
        }
        # Saved before the node is touched: undo (or a resume) must know what was created.
        ctx.save_data(self.kind, data)
        if not original:
            # A resume that finds every file written but no saved prediction yet.
            return StepResult.noop("already written: " + ", ".join(f.path for f in planned))
        kept = backups_on_node(runner, backups)
        for change in original:
            if change.before is None or change.path in kept:
                continue  # a retried attempt keeps the backup it took of the same bytes
            record = back_up_file(runner, change.path, backup_path_for(ctx.run_id, change.path))
            # Journalled before the file is replaced: a crash after the write still finds it.
            ctx.journal.append(
                BackupWritten(ctx.node, record.path, record.backup_path, record.sha256)
            )
        for change in original:
            assert change.after is not None  # removals were refused above
            replace_file(runner, change.path, change.after)
        written_at = read_node_clock(runner)
        ctx.save_data(self.kind, {**data, "written_at": written_at.isoformat()})
        handlers = ", ".join(handlers_before) or "none"
        return StepResult.done(
            f"wrote {', '.join(f.path for f in original)} "
            f"(backups under {backup_path_for(ctx.run_id, '/')}; handlers before: {handlers})"
        )

    def _predict(
        self, ctx: StepContext, files: engine.ConfigFiles, planned: Sequence[FileChange]
    ) -> engine.Prediction:
        runner = ctx.runner
        version = read_fact(runner, ContainerdVersionFact())
        check_containerd_version(ctx.node_plan.containerd_version, version)
        intent = build_intent(ctx.spec)
        if intent is None:
            raise self._fail(ctx, "the plan writes files but the spec holds no CRI setting")
        base = with_planned_before(files, planned)
        # what an earlier attempt of this run staged and could not remove (it was killed)
        remove_stages(runner, ctx.run_id)
        writes = [engine.FileWrite(f.path, f.before, f.after or "") for f in planned]
        try:
            # a plan that repairs a shadowing drop-in gives back the keys it hid: those may
            # come back, and nothing else may change
            restoring = engine.repair_scope(base, version) if ctx.node_plan.repairs else ()
            prediction = engine.predict(
                runner, CONTAINERD_BIN, base, writes, intent, version, restoring, owner=ctx.run_id
            )
        except engine.PredictionRefused as exc:
            raise self._fail(ctx, f"prediction refused the change: {exc}") from exc
        lost = set(list_runtime_handlers(prediction.before)) - set(
            list_runtime_handlers(prediction.after)
        )
        if lost:
            raise self._fail(
                ctx,
                f"runtime handler(s) {', '.join(sorted(lost))} would vanish; nothing was written",
            )
        return prediction

    def undo(self, ctx: StepContext) -> None:
        """Restore the backups (the toolkit's drop-in as containerd_undo says), delete created
        files, restart, and check what containerd loads against what it loaded before."""
        planned = list(ctx.node_plan.files)
        data = ctx.load_data(self.kind)
        if not planned or not data:
            return  # data is saved before the first byte is written: nothing was touched
        with translate_step_errors(ctx.node, self.kind, undo=True):
            self._undo(ctx, planned, data)

    def _undo(self, ctx: StepContext, planned: list[FileChange], data: Mapping[str, Any]) -> None:
        notes = undo_files(ctx, self.kind, planned, recorded_backups(ctx), data)
        before, written = data.get("before_dump"), data.get("after_dump")
        if notes is None or not isinstance(before, Mapping) or not isinstance(written, Mapping):
            return  # nothing restored, or killed before anything was predicted or written
        live = read_live_dump(ctx.runner, ctx.facts.config_files.main_path)
        handlers = [str(h) for h in data.get("handlers_before", [])]
        # judged by what containerd loads (redacted again: an older run saved it in clear)
        problems = judge_undo(
            as_saved(before), as_saved(written), live, handlers, toolkit_drop_in_absent(ctx)
        )
        if problems:
            raise self._fail(
                ctx,
                "undo: files restored and containerd restarted, but containerd does not load "
                "what it loaded before the write:\n  " + "\n  ".join(problems),
            )
        for note in notes:
            ctx.progress(f"{ctx.node}: undo: {note}; containerd loads what it did before")

    def _fail(self, ctx: StepContext, message: str) -> StepFailed:
        return StepFailed(ctx.node, self.kind, message)


class ContainerdVerify(ContainerdFileStep):
    """After the restart: the real dump is the predicted one and every handler is still there."""

    kind: ClassVar[str] = "containerd.verify"
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=(),
        expected_s=2.0,
        worst_s=bounded_by_requests,
    )
    action: ClassVar[str] = "containerd config dump == predicted"

    def act(self, ctx: StepContext) -> StepResult:
        data = ctx.load_data(WRITE_STEP)
        saved = data.get("after_dump")
        if not isinstance(saved, Mapping):
            raise self._fail(ctx, f"{WRITE_STEP} saved no predicted config: run it first")
        expected = as_saved(saved)  # redacted, also when an older run saved it in clear
        return self._verify(ctx, data, expected)

    def _verify(
        self, ctx: StepContext, data: Mapping[str, Any], expected: Mapping[str, Any]
    ) -> StepResult:
        state = probe_service(ctx.runner)
        written_at = written_at_of(data)
        if written_at is not None and not state.started_after(written_at):
            raise self._fail(
                ctx,
                f"the running containerd ({state.describe()}) did not start after the files "
                f"were written at {written_at.isoformat()}: it may still run the old config; "
                "run systemd.restart",
            )
        live = read_live_dump(ctx.runner, ctx.facts.config_files.main_path)
        before = tuple(str(h) for h in data.get("handlers_before", []))
        now = list_runtime_handlers(live)
        missing = [h for h in before if h not in now]
        problems: list[str] = []
        if missing:
            problems.append(
                f"runtime handler(s) present before are gone: {', '.join(missing)} "
                "(pods with those runtime classes, the device plugin first, will not start)"
            )
        if live != expected:
            problems.append(
                "`containerd config dump` differs from the prediction:\n"
                + describe_dump_difference(expected, live)
            )
        if problems:
            raise self._fail(
                ctx,
                "\n".join(problems) + "\n  roll the node back: containerd.write's undo "
                "restores the files",
            )
        return StepResult.done(
            f"config dump matches the prediction; handlers now: {', '.join(now) or 'none'} "
            f"(before: {', '.join(before) or 'none'}); {state.describe()}"
        )

    def undo(self, ctx: StepContext) -> None:
        """Nothing: verification changes nothing on the node."""

    def _fail(self, ctx: StepContext, message: str) -> StepFailed:
        return StepFailed(ctx.node, self.kind, message)
