"""The node-side steps on the lab: real SSH, real systemd, real containerd 1.6, 1.7 and 2.1.

Each test plans the registry-mirror example from live facts, runs containerd.write,
systemd.restart and containerd.verify on one node, and restores the node afterwards (files
byte for byte, containerd restarted on them), so the other lab tests see it as it was.
"""

from __future__ import annotations

import contextlib
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout.changes.containerd import steps as containerd_steps
from rollout.changes.containerd.steps import (
    ContainerdVerify,
    ContainerdWrite,
    describe_dump_difference,
)
from rollout.commands import CommandRunner
from rollout.containerd.runtimehandlers import list_runtime_handlers
from rollout.containerd.staging import normalise_dump
from rollout.errors import RolloutError
from rollout.facts import ClusterFacts, FleetFacts
from rollout.facts.live import node_facts_from, probe_node
from rollout.inventory import load_inventory
from rollout.lab.cluster import CONTEXT, Lab
from rollout.lab.nodes import NodeSpec
from rollout.operatornames import OPERATOR_NAMESPACE
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.run import Journal
from rollout.spec import load_spec
from rollout.steps.backup import BACKUP_ROOT, replace_file
from rollout.steps.base import StepContext, StepFailed, StepResultKind
from rollout.steps.operandsettle import unsettled_operands
from rollout.steps.systemd import SystemdRestart, probe_service
from rollout.transports.kube import KubeClient
from rollout.transports.ssh import SshRunner
from tests.examples import PLAN
from tests.lab.labapi import api_lab, wait_for
from tests.lab.test_cluster_shared import node_of_series, ssh_check, ssh_run

pytestmark = pytest.mark.lab

HOSTS_TOML = "/etc/containerd/certs.d/docker.io/hosts.toml"
FAILING_DROP_IN = "/etc/systemd/system/containerd.service.d/90-rollout-test-fail.conf"
SERIES = ("1.6", "1.7", "2.1")
RESTART_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return api_lab(request)


@dataclass
class NodeRun:
    """One node's step context for one test, with what the node looked like before."""

    node: NodeSpec
    ctx: StepContext
    runner: SshRunner
    sums_before: dict[str, str]
    dump_before: str


def make_context(lab: Lab, node: NodeSpec, state_dir: Path) -> tuple[StepContext, SshRunner]:
    """A StepContext of a fresh run, planned from the node's live facts."""
    spec = load_spec(PLAN)
    spec = spec.model_copy(
        update={
            "policy": spec.policy.model_copy(
                update={
                    "verify": spec.policy.verify.model_copy(
                        update={"containerd_restart_timeout_s": RESTART_TIMEOUT_S}
                    )
                }
            )
        }
    )
    host = load_inventory(lab.inventory).by_name(node.name)
    assert host is not None
    runner = SshRunner(host)
    kube = KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT)
    facts = node_facts_from(node.name, probe_node(runner), kube.get_node(node.name))
    fleet = FleetFacts(nodes=(facts,), cluster=ClusterFacts(), source="live")
    plan = build_plan(spec, str(PLAN), fleet, load_playbooks())
    (node_plan,) = plan.nodes
    journal = Journal.create(state_dir, "test", "{}")
    ctx = StepContext(
        node=node.name,
        node_plan=node_plan,
        facts=facts,
        spec=spec,
        runner=runner,
        kube=kube,
        journal=journal,
        progress=lambda _: None,
    )
    return ctx, runner


def file_sums(lab: Lab, node: NodeSpec) -> dict[str, str]:
    """sha256 of every file under /etc/containerd on the node."""
    out = ssh_check(
        lab, node, ["sh", "-c", "find /etc/containerd -type f -exec sha256sum {} + | sort"]
    )
    return {line.split()[1]: line.split()[0] for line in out.splitlines() if line}


def live_dump(lab: Lab, node: NodeSpec) -> str:
    return ssh_check(lab, node, ["sh", "-c", "cd / && containerd config dump"])


# The lab's operator re-renders its DaemonSets within a tick of a ClusterPolicy write
STABLE_S = 3.0


def settled(lab: Lab, node: NodeSpec, kube: KubeClient) -> str | None:
    """The operator's DaemonSets rolled out, containerd active and running the toolkit's
    `nvidia` handler: containerd's MainPID then, else None."""
    if unsettled_operands(kube.list_daemonsets(OPERATOR_NAMESPACE), kube.list_nodes()):
        return None
    shown = ssh_run(lab, node, ["systemctl", "show", "-p", "MainPID,ActiveState", "containerd"])
    if "ActiveState=active" not in shown.stdout:
        return None
    dump = ssh_run(lab, node, ["sh", "-c", "cd / && containerd config dump"])
    if dump.exit_code != 0 or "nvidia" not in handlers_of(dump.stdout):
        return None
    return shown.stdout.split("MainPID=")[1].split()[0]


def wait_until_settled(lab: Lab, node: NodeSpec) -> None:
    """Settled, and still so with the same containerd STABLE_S later: a toolkit re-run that
    another test's ClusterPolicy change set off deletes the drop-in and restarts containerd
    once the operator has re-rendered its DaemonSets, a moment after the write."""
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as kube:
        for _ in range(12):
            pid = wait_for(
                lambda: settled(lab, node, kube),
                120.0,
                what=f"{node.name}'s containerd to run with the toolkit's handlers",
                interval_s=0.5,
            )
            time.sleep(STABLE_S)
            if settled(lab, node, kube) == pid:
                return
    raise AssertionError(f"{node.name}'s containerd kept restarting")


def restore_node(lab: Lab, run: NodeRun) -> None:
    """Whatever a test left, put the node back: files, service, and remove test drop-ins."""
    ssh_run(lab, run.node, ["rm", "-f", FAILING_DROP_IN])
    ssh_run(lab, run.node, ["systemctl", "daemon-reload"])
    try:
        ContainerdWrite().undo(run.ctx)
    finally:
        ssh_run(lab, run.node, ["rm", "-rf", f"{BACKUP_ROOT}/{run.ctx.run_id}"])
        ssh_run(lab, run.node, ["rmdir", "-p", "--ignore-fail-on-non-empty", BACKUP_ROOT])
        ssh_run(lab, run.node, ["systemctl", "reset-failed", "containerd"])
        state = ssh_check(lab, run.node, ["systemctl", "is-active", "containerd"]).strip()
        run.runner.close()
        run.ctx.journal.close()
    assert state == "active"
    assert file_sums(lab, run.node) == run.sums_before


@contextlib.contextmanager
def running_on(lab: Lab, node: NodeSpec, state_dir: Path) -> Iterator[NodeRun]:
    """A run of the node steps on `node` (its files and dump as they were first), the node
    restored after through the run's own runner, whatever runner a test put in its place."""
    ctx, runner = make_context(lab, node, state_dir)
    run = NodeRun(node, ctx, runner, file_sums(lab, node), live_dump(lab, node))
    try:
        yield run
    finally:
        run.ctx.runner = run.runner
        restore_node(lab, run)


@pytest.fixture(params=SERIES)
def node_run(lab: Lab, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NodeRun]:
    node = node_of_series(lab, str(request.param))
    # The shared lab's toolkits re-run when another test changes the ClusterPolicy (each
    # deletes its drop-in and restarts containerd): start from a settled node.
    wait_until_settled(lab, node)
    with running_on(lab, node, tmp_path / "state") as run:
        yield run


def assert_same_dump(now: str, before: str) -> None:
    """The two dumps are equal; the differing leaves in the message when not."""
    # 1.x prints `imports` in map order, which changes from run to run: compare as the
    # steps do, without it.
    now_tree = normalise_dump(tomllib.loads(now), "")
    before_tree = normalise_dump(tomllib.loads(before), "")
    assert now_tree == before_tree, describe_dump_difference(before_tree, now_tree)


def handlers_of(dump_text: str) -> tuple[str, ...]:
    return list_runtime_handlers(tomllib.loads(dump_text))


def config_path_of(dump: dict[str, Any]) -> Sequence[str]:
    """Every registry config_path in a dump, over the CRI plugin tables of any version."""
    found = []
    for table in dump.get("plugins", {}).values():
        registry = table.get("registry") if isinstance(table, dict) else None
        if isinstance(registry, dict) and "config_path" in registry:
            found.append(registry["config_path"])
    return found


def test_write_restart_verify_then_undo(lab: Lab, node_run: NodeRun) -> None:
    ctx, node = node_run.ctx, node_run.node
    handlers = handlers_of(node_run.dump_before)
    assert "nvidia" in handlers
    planned = [f.path for f in ctx.node_plan.files]
    assert HOSTS_TOML in planned
    pid_before = probe_service(ctx.runner).main_pid

    wrote = ContainerdWrite().apply(ctx)
    assert wrote.kind is StepResultKind.DONE, wrote.detail
    restarted = SystemdRestart().apply(ctx)
    assert restarted.kind is StepResultKind.DONE, restarted.detail
    verified = ContainerdVerify().apply(ctx)
    assert verified.kind is StepResultKind.DONE, verified.detail

    # invariants 1-3 on the real node
    after = tomllib.loads(live_dump(lab, node))
    assert list_runtime_handlers(after) == handlers
    assert "/etc/containerd/certs.d" in config_path_of(after)
    assert "mirror.registry.internal:5000" in ssh_check(lab, node, ["cat", HOSTS_TOML])
    assert ssh_check(lab, node, ["stat", "-c", "%a %U:%G", HOSTS_TOML]).strip() == "644 root:root"
    assert probe_service(ctx.runner).main_pid != pid_before
    # invariant 6: every replaced file backed up, journalled with the original's sum
    backups = ctx.journal.replay().node(node.name).backups
    replaced = [f.path for f in ctx.node_plan.files if f.before is not None]
    assert sorted(b.path for b in backups) == sorted(replaced)
    for backup in backups:
        assert backup.sha256 == node_run.sums_before[backup.path]
        copy = ssh_check(lab, node, ["sha256sum", backup.backup_path]).split()[0]
        assert copy == backup.sha256
    # modes and owners kept on replaced files
    for path in replaced:
        assert ssh_check(lab, node, ["stat", "-c", "%a %U:%G", path]).strip() == "644 root:root"

    # apply again, as a resume whose first answers were lost: nothing is done twice. The
    # restart is found done by the earlier attempt (journalled as rollout's own restart,
    # DONE, since af9d82b), and containerd is not restarted again
    assert ContainerdWrite().apply(ctx).kind is StepResultKind.NOOP
    pid_restarted = probe_service(ctx.runner).main_pid
    again = SystemdRestart().apply(ctx)
    assert again.kind is StepResultKind.DONE and "earlier attempt" in again.detail, again.detail
    assert probe_service(ctx.runner).main_pid == pid_restarted
    assert ContainerdVerify().apply(ctx).kind is StepResultKind.DONE
    assert len(ctx.journal.replay().node(node.name).backups) == len(replaced)

    # undo: byte-exact files, containerd restarted onto the old dump
    pid_written = probe_service(ctx.runner).main_pid
    ContainerdWrite().undo(ctx)
    assert file_sums(lab, node) == node_run.sums_before
    assert ssh_run(lab, node, ["test", "-e", "/etc/containerd/certs.d"]).exit_code == 1
    assert_same_dump(live_dump(lab, node), node_run.dump_before)
    assert probe_service(ctx.runner).main_pid not in {pid_written, 0}
    # undo is idempotent
    ContainerdWrite().undo(ctx)
    assert file_sums(lab, node) == node_run.sums_before


def test_write_refuses_a_node_changed_since_the_plan(lab: Lab, node_run: NodeRun) -> None:
    ctx, node = node_run.ctx, node_run.node
    main = ctx.facts.config_files.main_path
    original = ssh_check(lab, node, ["cat", main])
    ssh_check(lab, node, ["sh", "-c", 'printf "# edited by hand\\n" >> "$1"', "sh", main])
    try:
        with pytest.raises(StepFailed, match="node changed since the plan") as failed:
            ContainerdWrite().apply(ctx)
        assert main in str(failed.value) and "+# edited by hand" in str(failed.value)
        # nothing written, nothing backed up
        assert ssh_run(lab, node, ["test", "-e", HOSTS_TOML]).exit_code == 1
        assert ssh_run(lab, node, ["test", "-e", f"{BACKUP_ROOT}/{ctx.run_id}"]).exit_code == 1
        assert ctx.journal.replay().node(node.name).backups == ()
        assert ctx.load_data("containerd.write") == {}
    finally:
        ssh_check(lab, node, ["sh", "-c", 'cat > "$1"', "sh", main], stdin=original.encode())
    assert file_sums(lab, node) == node_run.sums_before


def test_restart_failure_is_reported_then_undo_restores(lab: Lab, node_run: NodeRun) -> None:
    ctx, node = node_run.ctx, node_run.node
    assert ContainerdWrite().apply(ctx).kind is StepResultKind.DONE
    drop_in = "[Service]\nExecStartPre=/bin/false\n"
    ssh_check(lab, node, ["sh", "-c", 'cat > "$1"', "sh", FAILING_DROP_IN], stdin=drop_in.encode())
    ssh_check(lab, node, ["systemctl", "daemon-reload"])
    with pytest.raises(StepFailed) as failed:
        SystemdRestart().apply(ctx)
    message = str(failed.value)
    assert f"{node.name}: systemd.restart:" in message
    assert "did not come back active with a new MainPID" in message
    assert "journalctl -u containerd" in message and "states seen" in message
    # the containerd.verify step refuses a node whose containerd did not restart
    with pytest.raises(StepFailed):
        ContainerdVerify().apply(ctx)

    ssh_check(lab, node, ["rm", "-f", FAILING_DROP_IN])
    ssh_check(lab, node, ["systemctl", "daemon-reload"])
    ContainerdWrite().undo(ctx)
    assert file_sums(lab, node) == node_run.sums_before
    assert_same_dump(live_dump(lab, node), node_run.dump_before)
    assert probe_service(ctx.runner).running


def test_resume_after_a_partial_write_finishes_it(
    lab: Lab, node_run: NodeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped between two file replacements: the next attempt writes the rest, once."""
    ctx, node = node_run.ctx, node_run.node
    files = ctx.node_plan.files
    assert len(files) >= 2
    real_replace = replace_file
    calls: list[str] = []

    def replace_then_stop(runner: CommandRunner, path: str, text: str) -> str:
        if calls:
            raise RolloutError("stopped by the test after one file")
        calls.append(path)
        return real_replace(runner, path, text)

    monkeypatch.setattr(containerd_steps, "replace_file", replace_then_stop)
    with pytest.raises(StepFailed, match="stopped by the test"):
        ContainerdWrite().apply(ctx)
    monkeypatch.setattr(containerd_steps, "replace_file", real_replace)

    result = ContainerdWrite().apply(ctx)
    assert result.kind is StepResultKind.DONE, result.detail
    assert calls[0] not in result.detail  # already written, not written again
    # The written file's backup was not taken again (it would hold the new bytes); a file
    # still original may be backed up again, with the same bytes.
    backups = ctx.journal.replay().node(node.name).backups
    assert [b.path for b in backups].count(calls[0]) <= 1
    for backup in backups:
        assert backup.sha256 == node_run.sums_before[backup.path]
        copy = ssh_check(lab, node, ["sha256sum", backup.backup_path]).split()[0]
        assert copy == backup.sha256
    assert SystemdRestart().apply(ctx).kind is StepResultKind.DONE
    assert ContainerdVerify().apply(ctx).kind is StepResultKind.DONE
