"""The node-side steps under faults on the lab: a dropped SSH connection, a containerd other
than the planned one, a run killed while staging.

The connection is cut for real: the step's command runs on the node, then kills the sshd
process serving this very connection (found by walking up from the command's own process),
so the step loses the answer of a command that took effect. The step must let that
transient error reach the retry policy, and the retried step must not do anything twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from rollout.changes.containerd.steps import ContainerdVerify, ContainerdWrite, remove_run_stages
from rollout.commands import CommandResult
from rollout.errors import TransientError
from rollout.lab.cluster import Lab
from rollout.retry import RetryPolicy, call_with_policy
from rollout.steps.base import StepContext, StepFailed, StepResult, StepResultKind
from rollout.steps.preflight import Preflight
from rollout.steps.systemd import SystemdRestart, probe_service
from rollout.transports.errors import SshConnectError
from tests.fakes import ScriptedRunner
from tests.lab.labapi import api_lab
from tests.lab.test_cluster_shared import node_of_series, ssh_check, ssh_run
from tests.lab.test_steps_node import SERIES, NodeRun, file_sums, running_on

pytestmark = pytest.mark.lab

# Runs the command, then SIGKILLs the nearest sshd above it: the session process of the
# connection the command came through. Its exit status never reaches the client.
_CUT_SCRIPT = (
    '"$@"; p=$$; while [ "$p" -gt 1 ]; do '
    'p=$(sed -n "s/^PPid:[[:space:]]*//p" "/proc/$p/status"); '
    'case "$(cat "/proc/$p/comm")" in sshd*) kill -9 "$p"; exit 0;; esac; done; exit 97'
)
RETRY = RetryPolicy(attempts=3, first_wait_s=0.2, max_wait_s=1.0, deadline_s=60.0)
STAGES = "/tmp/rollout-containerd"


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return api_lab(request)


@pytest.fixture
def fault_run(lab: Lab, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NodeRun]:
    series = str(getattr(request, "param", "1.7"))
    with running_on(lab, node_of_series(lab, series), tmp_path / "state") as run:
        yield run


class Killed(BaseException):
    """The rollout process died (kill -9): nothing after it runs, not even `finally`."""


@dataclasses.dataclass(kw_only=True)
class FaultyRunner(ScriptedRunner):
    """The real runner, but the first command matching `cut` loses its connection once it
    has run on the node; with `kill`, that command and everything after it never return."""

    cut: Callable[[Sequence[str]], bool]
    kill: bool = False
    faults: list[BaseException] = dataclasses.field(default_factory=list)

    def answer(self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float) -> CommandResult:
        if self.kill and self.faults:
            raise Killed("the process is gone")
        if self.faults or not self.cut(argv):
            return super().answer(argv, stdin, timeout_s)
        if self.kill:
            self.faults.append(Killed(f"killed while running {argv[:4]}"))
            raise self.faults[-1]
        cut = ("sh", "-c", _CUT_SCRIPT, "rollout-cut", *argv)
        try:
            result = super().answer(cut, stdin, timeout_s)
        except TransientError as exc:
            self.faults.append(exc)
            raise
        raise AssertionError(f"the connection survived the cut: {result}")


def apply_with_retries(step: Callable[[StepContext], StepResult], ctx: StepContext) -> StepResult:
    """As the executor runs a step: under the one retry policy."""
    return call_with_policy(lambda: step(ctx), RETRY)


@pytest.mark.parametrize("fault_run", SERIES, indirect=True)
def test_a_dropped_connection_is_retried_and_nothing_is_done_twice(
    lab: Lab, fault_run: NodeRun
) -> None:
    ctx, node = fault_run.ctx, fault_run.node
    replaced = [f.path for f in ctx.node_plan.files if f.before is not None]
    assert len(ctx.node_plan.files) >= 2
    pid_before = probe_service(fault_run.runner).main_pid

    # containerd.write: the connection drops right after the first file was replaced
    writing = FaultyRunner(inner=fault_run.runner, cut=lambda argv: "rollout-write" in argv)
    ctx.runner = writing
    wrote = apply_with_retries(ContainerdWrite().apply, ctx)
    assert [type(f) for f in writing.faults] == [SshConnectError]
    assert wrote.kind is StepResultKind.DONE, wrote.detail
    for change in ctx.node_plan.files:
        assert writing.count("rollout-write", change.path) == 1, change.path
    backups = ctx.journal.replay().node(node.name).backups
    assert sorted(b.path for b in backups) == sorted(replaced)  # one backup per file
    for backup in backups:
        assert backup.sha256 == fault_run.sums_before[backup.path]

    # systemd.restart: the connection drops once `systemctl restart` has run
    restarting = FaultyRunner(
        inner=fault_run.runner, cut=lambda argv: argv[:2] == ("systemctl", "restart")
    )
    ctx.runner = restarting
    restarted = apply_with_retries(SystemdRestart().apply, ctx)
    assert [type(f) for f in restarting.faults] == [SshConnectError]
    assert restarted.kind is StepResultKind.DONE, restarted.detail  # its own restart
    assert "restarted by an earlier attempt whose answer was lost" in restarted.detail
    assert restarting.count("systemctl", "restart") == 1
    pid_after = probe_service(fault_run.runner).main_pid
    assert pid_after not in {pid_before, 0}

    # containerd.verify: the connection drops while the live config is dumped
    verifying = FaultyRunner(inner=fault_run.runner, cut=lambda argv: "rollout-dump" in argv)
    ctx.runner = verifying
    verified = apply_with_retries(ContainerdVerify().apply, ctx)
    assert [type(f) for f in verifying.faults] == [SshConnectError]
    assert verified.kind is StepResultKind.DONE, verified.detail
    assert probe_service(fault_run.runner).main_pid == pid_after  # no second restart


def test_a_resumed_run_refuses_a_containerd_changed_since_the_plan(
    lab: Lab, fault_run: NodeRun
) -> None:
    """The resume's fresh facts agree with the node; the plan does not: refused, both named."""
    ctx, node = fault_run.ctx, fault_run.node
    live = str(ctx.facts.containerd)
    major, minor, patch = live.split(".")
    planned = f"{major}.{minor}.{int(patch) + 1}"
    ctx.node_plan = dataclasses.replace(ctx.node_plan, containerd_version=planned)
    for step in (Preflight(), ContainerdWrite()):
        with pytest.raises(StepFailed) as refused:
            step.apply(ctx)
        assert f"containerd changed since the plan: {live} now, {planned} planned" in str(
            refused.value
        )
    assert file_sums(lab, node) == fault_run.sums_before
    assert ctx.load_data("containerd.write") == {}


def stages_of(lab: Lab, run: NodeRun, owner: str) -> list[str]:
    out = ssh_run(lab, run.node, ["sh", "-c", f"ls -d {STAGES}.{owner}.* 2>/dev/null"])
    return out.stdout.split()


def test_a_resumed_write_removes_what_a_killed_one_staged_and_nothing_else(
    lab: Lab, fault_run: NodeRun
) -> None:
    ctx, node = fault_run.ctx, fault_run.node
    other = ssh_check(lab, node, ["mktemp", "-d", "-t", "rollout-containerd.other-run.XXXXXX"])
    try:
        # killed while containerd dumps the staged files: the `rm -rf` of the stage never runs
        killing = FaultyRunner(
            inner=fault_run.runner,
            cut=lambda argv: "rollout-dump" in argv and argv[4].startswith(STAGES),
            kill=True,
        )
        ctx.runner = killing
        with pytest.raises(Killed):
            ContainerdWrite().apply(ctx)
        assert len(stages_of(lab, fault_run, ctx.run_id)) == 1, "the kill left the stage"

        ctx.runner = fault_run.runner  # resumed by a new process
        resumed = ContainerdWrite().apply(ctx)
        assert resumed.kind is StepResultKind.DONE, resumed.detail
        assert stages_of(lab, fault_run, ctx.run_id) == []
        assert stages_of(lab, fault_run, "other-run") == [other.strip()]

        # and the end of a run removes whatever the run left on its nodes
        ssh_check(lab, node, ["mktemp", "-d", "-t", f"rollout-containerd.{ctx.run_id}.XXXXXX"])
        assert remove_run_stages({node.name: fault_run.runner}, ctx.run_id) == {}
        assert stages_of(lab, fault_run, ctx.run_id) == []
        assert stages_of(lab, fault_run, "other-run") == [other.strip()]
    finally:
        ssh_run(lab, node, ["rm", "-rf", "--", other.strip()])
