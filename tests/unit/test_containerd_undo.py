"""The undo of containerd.write against the toolkit, which writes and deletes its drop-in
(conf.d/99-nvidia.toml) on its own at any instant: the undo is judged by what containerd
loads, not by the bytes of a file another writer owns.

A scripted node: its files in a dict, the node-side scripts of rollout.steps.backup played
on it, a `toolkit` hook that acts right after rollout's rename (the race seen in the lab:
`sha256sum: ... No such file or directory` after the `mv`), and a `containerd config dump`
derived from the files (the nvidia handler while the drop-in is there, the registry
setting while a file sets it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from rollout.changes.containerd.steps import ContainerdWrite
from rollout.commands import CommandResult
from rollout.containerd import ConfigFiles, parse_version
from rollout.containerd.dump import _DUMP_SCRIPT
from rollout.facts import NodeFacts
from rollout.plan import FileChange, NodePlan
from rollout.run import BackupWritten, Journal
from rollout.spec import load_spec
from rollout.steps import backup
from rollout.steps.base import StepContext, StepFailed
from rollout.steps.containerd_undo import TOOLKIT_DROP_IN, judge_undo
from rollout.transports.kube import KubeClient
from tests.examples import PLAN
from tests.fakes import ScriptedRunner
from tests.unit.test_steps_node import show

MAIN = "/etc/containerd/config.toml"
CRI = "io.containerd.grpc.v1.cri"
CERTS = "/etc/containerd/certs.d"
MAIN_BEFORE = "version = 2\n"
MAIN_AFTER = f'version = 2\n[plugins."{CRI}".registry]\nconfig_path = "{CERTS}"\n'
DROP_IN_BEFORE = "# toolkit: nvidia handlers\n"
DROP_IN_AFTER = f"# toolkit: nvidia handlers\n# rollout: config_path = {CERTS}\n"
PLANNED = (
    FileChange(MAIN, MAIN_BEFORE, MAIN_AFTER, ""),
    FileChange(TOOLKIT_DROP_IN, DROP_IN_BEFORE, DROP_IN_AFTER, ""),
)


def dump_tree(handlers: Sequence[str], config_path: str) -> dict[str, Any]:
    runtimes = {h: {"runtime_type": "io.containerd.runc.v2"} for h in handlers}
    cri = {"containerd": {"runtimes": runtimes}, "registry": {"config_path": config_path}}
    return {"version": 2, "plugins": {CRI: cri}}


BEFORE = dump_tree(["nvidia", "runc"], "")
WRITTEN = dump_tree(["nvidia", "runc"], CERTS)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Node:
    """The node's files, and what the toolkit does the moment rollout renames a file over
    its drop-in (None: nothing; "" deletes it; any other text is what it writes)."""

    files: dict[str, str]
    toolkit: str | None = None
    restarts: int = 0
    notes: list[str] = field(default_factory=list)

    def runner(self) -> ScriptedRunner:
        shows = [show(37 + i) for i in range(4)]
        return (
            ScriptedRunner(name="gpu-1")
            .on(["sh", "-c"], self.script)
            .on(["systemctl", "restart"], self.restart)
            .on(["systemctl", "show"], *shows)
        )

    def restart(self, argv: Sequence[str]) -> CommandResult:
        self.restarts += 1
        return CommandResult(tuple(argv), 0, "", "", "gpu-1")

    def script(self, argv: Sequence[str]) -> CommandResult:
        text, args = argv[2], list(argv[4:])
        handler: dict[str, Callable[[list[str]], tuple[int, str, str]]] = {
            backup._READ_SCRIPT: self.read,
            backup._RESTORE_SCRIPT: self.restore,
            backup._RESTORE_SHARED_SCRIPT: self.restore_shared,
            _DUMP_SCRIPT: self.dump,
        }
        code, out, err = handler[text](args) if text in handler else (0, "", "")
        return CommandResult(tuple(argv), code, out, err, "gpu-1")

    def read(self, paths: list[str]) -> tuple[int, str, str]:
        """backup.read_node_files' output: `path NUL 0|1 NUL content NUL` per path."""
        found = {p: self.files.get(p) for p in paths}
        return (
            0,
            "".join(f"{p}\0{'0' if t is None else '1'}\0{t or ''}\0" for p, t in found.items()),
            "",
        )

    def _rename(self, source: str, target: str) -> None:
        self.files[target] = self.files[source]
        if target == TOOLKIT_DROP_IN and self.toolkit is not None:
            if self.toolkit:
                self.files[target] = self.toolkit
            else:
                del self.files[target]

    def _sum(self, path: str) -> tuple[int, str, str]:
        if path not in self.files:
            return 1, "", f"sha256sum: {path}: No such file or directory"
        return 0, f"{sha(self.files[path])}  {path}\n", ""

    def restore(self, args: list[str]) -> tuple[int, str, str]:
        source, target = args
        self._rename(source, target)
        return self._sum(target)

    def restore_shared(self, args: list[str]) -> tuple[int, str, str]:
        source, target = args
        if target not in self.files:
            return 0, "absent\n", ""
        self._rename(source, target)
        code, out, _ = self._sum(target)
        return 0, out if code == 0 else "absent\n", ""

    def dump(self, args: list[str]) -> tuple[int, str, str]:
        handlers = ["nvidia", "runc"] if TOOLKIT_DROP_IN in self.files else ["runc"]
        loaded = any("config_path" in t for t in self.files.values())
        runtimes = "".join(
            f'[plugins."{CRI}".containerd.runtimes.{h}]\nruntime_type = "io.containerd.runc.v2"\n'
            for h in handlers
        )
        registry = f'[plugins."{CRI}".registry]\nconfig_path = "{CERTS if loaded else ""}"\n'
        return 0, f"version = 2\n{runtimes}{registry}", ""


def undo_on(node: Node, tmp_path: Path) -> StepContext:
    """containerd.write's undo on the node, after a write that replaced both files."""
    version = parse_version("containerd github.com/containerd/containerd v1.7.24 abc\n")
    facts = NodeFacts("gpu-1", version, ConfigFiles(MAIN, {MAIN: MAIN_BEFORE}))
    plan = NodePlan(name="gpu-1", containerd_version=str(version), steps=(), files=PLANNED)
    journal = Journal.create(tmp_path, "run-1", "{}")
    for change in PLANNED:
        copy = backup.backup_path_for("run-1", change.path)
        assert change.before is not None
        node.files[copy] = change.before
        journal.append(BackupWritten("gpu-1", change.path, copy, sha(change.before)))
    ctx = StepContext(
        node="gpu-1",
        node_plan=plan,
        facts=facts,
        spec=load_spec(PLAN),
        runner=node.runner(),
        kube=cast(KubeClient, None),
        journal=journal,
        progress=node.notes.append,
        sleep=lambda _: None,
    )
    saved = {
        "before_dump": BEFORE,
        "after_dump": WRITTEN,
        "handlers_before": ["nvidia", "runc"],
        "created_dirs": [],
        "written_at": "2026-11-29T23:39:00+00:00",
    }
    ctx.save_data("containerd.write", saved)
    ContainerdWrite().undo(ctx)
    return ctx


def written_node(toolkit: str | None = None) -> Node:
    return Node({MAIN: MAIN_AFTER, TOOLKIT_DROP_IN: DROP_IN_AFTER}, toolkit=toolkit)


def test_the_toolkit_deleting_its_drop_in_during_the_restore_is_no_failed_undo(
    tmp_path: Path,
) -> None:
    node = written_node(toolkit="")
    undo_on(node, tmp_path)
    assert node.files[MAIN] == MAIN_BEFORE, "rollout's own file restored byte for byte"
    assert TOOLKIT_DROP_IN not in node.files, "the toolkit's removal stands"
    assert node.restarts == 1
    assert node.notes == [
        f"gpu-1: undo: {TOOLKIT_DROP_IN} removed by its other writer (left absent); "
        "containerd loads what it did before"
    ]


def test_the_toolkit_rewriting_its_drop_in_during_the_restore_is_no_failed_undo(
    tmp_path: Path,
) -> None:
    node = written_node(toolkit="# toolkit: nvidia handlers, written again\n")
    undo_on(node, tmp_path)
    assert node.files[MAIN] == MAIN_BEFORE
    assert node.files[TOOLKIT_DROP_IN] == "# toolkit: nvidia handlers, written again\n"
    assert node.notes == [
        f"gpu-1: undo: {TOOLKIT_DROP_IN} rewritten by its other writer since the restore; "
        "containerd loads what it did before"
    ]


def test_a_drop_in_the_toolkit_removed_before_the_undo_is_not_brought_back(
    tmp_path: Path,
) -> None:
    node = Node({MAIN: MAIN_AFTER})
    undo_on(node, tmp_path)
    assert TOOLKIT_DROP_IN not in node.files
    assert node.files[MAIN] == MAIN_BEFORE


def test_an_undisturbed_drop_in_is_restored_byte_for_byte(tmp_path: Path) -> None:
    node = written_node()
    undo_on(node, tmp_path)
    assert node.files[TOOLKIT_DROP_IN] == DROP_IN_BEFORE and node.notes == []


def test_a_toolkit_copy_that_keeps_the_change_fails_the_undo_by_name(tmp_path: Path) -> None:
    """The toolkit copied a dump that held rollout's change into its drop-in after the
    restore: containerd would still load it, so the undo is not done."""
    node = written_node(toolkit=DROP_IN_AFTER)
    with pytest.raises(StepFailed) as raised:
        undo_on(node, tmp_path)
    message = str(raised.value)
    assert "containerd does not load what it loaded before the write" in message
    assert f"plugins.\"{CRI}\".registry.config_path is '{CERTS}', not '' as before" in message


def test_judge_undo_excuses_only_the_toolkits_handlers_and_only_while_its_drop_in_is_gone() -> None:
    live = dump_tree(["runc"], "")
    assert judge_undo(BEFORE, WRITTEN, live, ["nvidia", "runc"], True) == []
    assert judge_undo(BEFORE, WRITTEN, live, ["nvidia", "runc"], False) == [
        "runtime handler(s) present before are gone: nvidia"
    ]
    assert judge_undo(BEFORE, WRITTEN, dump_tree(["nvidia"], ""), ["nvidia", "runc"], True) == [
        "runtime handler(s) present before are gone: runc"
    ]
