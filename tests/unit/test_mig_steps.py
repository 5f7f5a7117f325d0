"""mig.configure and mig.wait against a fake node and a fake API whose MIG manager moves
the node's nvidia.com/mig.config.state through a script once the layout label changes:
pending -> success, failed, rebooting with a real new boot id, and a resumed run that finds
the label already set."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from rollout.changes.mig.model import MigChange
from rollout.changes.mig.steps import MigConfigure, MigWait
from rollout.commands import CommandResult
from rollout.facts.migmode import CONFIG_LABEL, STATE_LABEL
from rollout.plan import NodePlan
from rollout.run import Journal
from rollout.spec import Policy
from rollout.steps.base import StepContext, StepFailed, StepResultKind
from rollout.transports.errors import SshConnectError
from rollout.transports.kube import KubeClient, Node, Pod
from tests.fakes import InMemoryKube, ScriptedRunner
from tests.node_facts import containerd_node

NODE = "gpu-1"
BOOT_ID = "cat", "/proc/sys/kernel/random/boot_id"


@dataclass(kw_only=True)
class FakeNode(ScriptedRunner):
    """A node that answers its boot id and containerd's state, and reboots when told."""

    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    down_polls: int = 0  # SSH answers nothing for this many commands after a reboot

    def reboot(self) -> None:
        self.boot_id = str(uuid.uuid4())
        self.down_polls = 2

    def answer(self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float) -> CommandResult:
        self.calls.append(argv)
        if self.down_polls > 0:
            self.down_polls -= 1
            raise SshConnectError(NODE, "root@gpu-1", "cannot connect: connection refused")
        if argv == BOOT_ID:
            return CommandResult(argv, 0, self.boot_id + "\n", "", NODE)
        if argv[:3] == ("systemctl", "show", "containerd"):
            out = "MainPID=42\nActiveState=active\nSubState=running\nNRestarts=0\n"
            return CommandResult(argv, 0, out, "", NODE)
        raise AssertionError(f"unscripted command: {argv}")


class FakeMigKube(InMemoryKube):
    """A node whose MIG manager, once its layout label changes, reports the states of
    `script` one poll (get_node) at a time; `rebooting` reboots `host`."""

    def __init__(self, node: Node, host: FakeNode, script: list[str]) -> None:
        super().__init__(node)
        self.host = host
        self.script: list[str] = []
        self.planned = list(script)
        self.log = "applying MIG mode\nerror: MIG mode change failed\n"

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Node:
        before = self.nodes[name].labels.get(CONFIG_LABEL)
        node = super().patch_node_labels(name, labels)
        if node.labels.get(CONFIG_LABEL) != before:
            self.script = list(self.planned)
            node = super().patch_node_labels(name, {STATE_LABEL: "pending"})
        return node

    def get_node(self, name: str) -> Node:
        if self.script:
            state = self.script.pop(0)
            if state == "rebooting" and self.nodes[name].labels.get(STATE_LABEL) != "rebooting":
                self.host.reboot()
            if state:  # "": the manager has not looked at the node yet
                super().patch_node_labels(name, {STATE_LABEL: state})
        return self.nodes[name]

    def read_pod_log(
        self, namespace: str, name: str, container: str | None = None, tail_lines: int | None = None
    ) -> str:
        return self.log


def make_node(config: str = "all-disabled", state: str = "success") -> Node:
    return Node(
        NODE,
        uid="u1",
        resource_version="1",
        labels={CONFIG_LABEL: config, STATE_LABEL: state, "nvidia.com/mig.capable": "true"},
        conditions={"Ready": "True"},
    )


def make_context(
    tmp_path: Path, host: FakeNode, kube: FakeMigKube, layout: str = "all-1g.5gb"
) -> StepContext:
    spec = SimpleNamespace(changes=(MigChange(config=layout),), policy=Policy())
    journal = Journal.create(tmp_path, "unit", "{}")
    return StepContext(
        NODE,
        NodePlan(NODE, "1.7.24", ()),
        containerd_node(NODE, config=""),
        cast(Any, spec),
        cast(Any, host),
        cast(KubeClient, kube),
        journal,
        progress=lambda _: None,
        sleep=lambda _: None,
    )


def test_configure_labels_and_wait_sees_pending_then_success(tmp_path: Path) -> None:
    host = FakeNode()
    kube = FakeMigKube(make_node(), host, ["pending", "pending", "success"])
    ctx = make_context(tmp_path, host, kube)
    done = MigConfigure().apply(ctx)
    assert done.kind is StepResultKind.DONE
    assert done.detail == f"{CONFIG_LABEL} all-disabled -> all-1g.5gb"
    assert kube.node.labels[CONFIG_LABEL] == "all-1g.5gb"
    waited = MigWait().apply(ctx)
    assert waited.detail.startswith("layout all-1g.5gb applied (state success after")
    assert kube.node.labels[STATE_LABEL] == "success"


def test_failed_fails_the_node_naming_the_state_and_the_managers_log(tmp_path: Path) -> None:
    host = FakeNode()
    kube = FakeMigKube(make_node(), host, ["pending", "failed"])
    kube.pods["manager"] = Pod(
        namespace="gpu-operator",
        name="nvidia-mig-manager-x",
        uid="p1",
        resource_version="1",
        node_name=NODE,
        phase="Running",
        labels={"app": "nvidia-mig-manager"},
    )
    ctx = make_context(tmp_path, host, kube)
    MigConfigure().apply(ctx)
    with pytest.raises(StepFailed) as failed:
        MigWait().apply(ctx)
    message = str(failed.value)
    assert "nvidia.com/mig.config.state=failed for layout all-1g.5gb" in message
    assert "gpu-operator/nvidia-mig-manager-x logs:" in message
    assert "error: MIG mode change failed" in message


def test_rebooting_waits_for_a_new_boot_and_ready_then_success(tmp_path: Path) -> None:
    host = FakeNode()
    first_boot = host.boot_id
    kube = FakeMigKube(make_node(), host, ["pending", "rebooting", "rebooting", "success"])
    ctx = make_context(tmp_path, host, kube)
    MigConfigure().apply(ctx)
    assert ctx.load_data("mig.configure")["boot_before"] == first_boot
    waited = MigWait().apply(ctx)
    assert host.boot_id != first_boot
    assert f"rebooted (boot_id {first_boot[:8]} -> {host.boot_id[:8]})" in waited.detail
    assert waited.detail.startswith("layout all-1g.5gb applied")


def test_rebooting_without_a_new_boot_fails_at_the_reboot_limit(tmp_path: Path) -> None:
    host = FakeNode()
    kube = FakeMigKube(make_node(), host, ["pending"] + ["rebooting"] * 2000)
    kube.host = FakeNode(boot_id=host.boot_id)  # the manager "reboots" another host
    ctx = make_context(tmp_path, host, kube)
    MigConfigure().apply(ctx)
    with pytest.raises(StepFailed, match=r"state rebooting: waited 600s .* for a new boot_id"):
        MigWait().apply(ctx)


def test_a_state_stuck_pending_fails_at_the_wait_limit(tmp_path: Path) -> None:
    host = FakeNode()
    kube = FakeMigKube(make_node(), host, ["pending"] * 10_000)
    ctx = make_context(tmp_path, host, kube)
    MigConfigure().apply(ctx)
    with pytest.raises(StepFailed) as failed:
        MigWait().apply(ctx)
    assert "did not report layout all-1g.5gb applied within 300s" in str(failed.value)
    assert "nvidia.com/mig.config.state is pending" in str(failed.value)
    assert "no MIG manager pod (app=nvidia-mig-manager) on the node" in str(failed.value)


def test_a_resumed_configure_finds_the_label_set_and_keeps_the_first_previous(
    tmp_path: Path,
) -> None:
    host = FakeNode()
    kube = FakeMigKube(make_node(), host, ["pending", "success"])
    ctx = make_context(tmp_path, host, kube)
    MigConfigure().apply(ctx)
    # killed here; the resumed run applies the step again
    again = MigConfigure().apply(ctx)
    assert again.kind is StepResultKind.NOOP
    assert again.detail == f"{CONFIG_LABEL} already all-1g.5gb (was all-disabled)"
    assert ctx.load_data("mig.configure")["previous"] == "all-disabled"
    assert MigWait().apply(ctx).detail.startswith("layout all-1g.5gb applied")


def test_undo_puts_the_previous_layout_back_and_waits_for_success(tmp_path: Path) -> None:
    host = FakeNode()
    kube = FakeMigKube(make_node(), host, ["pending", "failed"])
    ctx = make_context(tmp_path, host, kube)
    MigConfigure().apply(ctx)
    with pytest.raises(StepFailed):
        MigWait().apply(ctx)
    kube.planned = ["pending", "success"]
    MigConfigure().undo(ctx)
    assert kube.node.labels[CONFIG_LABEL] == "all-disabled"
    assert kube.node.labels[STATE_LABEL] == "success"
    MigConfigure().undo(ctx)  # idempotent: the label is back already
    assert kube.node.labels[CONFIG_LABEL] == "all-disabled"


def test_undo_of_a_configure_that_never_ran_changes_nothing(tmp_path: Path) -> None:
    host = FakeNode()
    kube = FakeMigKube(make_node(), host, ["success"])
    ctx = make_context(tmp_path, host, kube)
    MigConfigure().undo(ctx)
    assert kube.node.labels[CONFIG_LABEL] == "all-disabled"
    assert host.calls == []


def test_a_label_someone_else_changes_fails_the_wait(tmp_path: Path) -> None:
    host = FakeNode()
    kube = FakeMigKube(make_node(), host, ["pending"] * 50)
    ctx = make_context(tmp_path, host, kube)
    MigConfigure().apply(ctx)
    kube.nodes[NODE] = replace(kube.node, labels={**kube.node.labels, CONFIG_LABEL: "all-7g.40gb"})
    with pytest.raises(StepFailed, match=r"is 'all-7g\.40gb', not 'all-1g\.5gb'"):
        MigWait().apply(ctx)


class LazyManagerKube(FakeMigKube):
    """A MIG manager that takes a new label up only a few polls later, writing nothing
    meanwhile: the node's state label is whatever the label's patch left."""

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Node:
        node = InMemoryKube.patch_node_labels(self, name, labels)
        if CONFIG_LABEL in labels:
            self.script = list(self.planned)
        return node


def test_the_state_of_the_layout_before_is_not_taken_for_the_new_ones(tmp_path: Path) -> None:
    host = FakeNode()
    kube = LazyManagerKube(make_node(), host, ["", "", "pending", "success"])
    ctx = make_context(tmp_path, host, kube)
    MigConfigure().apply(ctx)
    # the label's own patch says pending: the old layout's success is gone with it
    assert kube.node.labels[STATE_LABEL] == "pending"
    MigWait().apply(ctx)
    assert kube.script == [], "the wait lasted until the manager's own success"
