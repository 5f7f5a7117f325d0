"""`rollout apply`, `resume` and `status` over the run store, with recorded facts and the API
emulator instead of SSH and a real cluster: the Lease before the run, clear errors for a run
resume cannot open, and where a run stands (finished, halted, running, interrupted).

What apply does alike wherever its run is kept (a state directory, or the cluster when it runs
in the scheduled pod) is tested for both places here; the rest of the scheduled pod's runs in
test_run_commands_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import rollout.cli.apply as cli_apply
from rollout.cli import main
from rollout.cli.status import window_note
from rollout.executor import RunReport
from rollout.lease import RunLease
from rollout.plan import Plan, plan_from_data, plan_to_data
from rollout.run import (
    INVOCATION_FILE,
    PLAN_FILE,
    CordonedByRollout,
    Invocation,
    Journal,
    RunFinished,
    RunHalted,
    RunOutcome,
    StepFinished,
    StepOutcome,
    StepStarted,
    list_runs,
    read_run,
)
from rollout.spec import Spec
from rollout.transports.kube import KubeClient
from tests.unit import runfakes
from tests.unit.runfakes import PLAN, RunPlace, apply_args, kill_lock_holder, start_lock_holder

# the run commands' fixtures, shared with test_run_commands_cluster.py
kube, plan, fleet, in_pod = runfakes.kube, runfakes.plan, runfakes.fleet, runfakes.in_pod
place = runfakes.place

HALT_REASON = "halt label on gpu-b-1 (nvidia.com/gpu-driver-upgrade-state=upgrade-failed)"


def make_run(state: Path, plan: Plan, *, invocation: Invocation | None = None) -> Journal:
    return Journal.create(state, plan.name, json.dumps(plan_to_data(plan)), invocation=invocation)


def other_run_holds_the_lease(kube: KubeClient) -> RunLease:
    holder = RunLease(kube, "rollout/someone-elses-run", renew_every_s=3600)
    holder.acquire()
    return holder


def status(state: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(["status", *args, "--state-dir", str(state)]) == 0
    return capsys.readouterr().out


# --- apply and the Lease ----------------------------------------------------------------------


def test_an_apply_refused_by_the_lease_creates_no_run(
    fleet: KubeClient, plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    make_run(state, plan).close()  # an earlier run, interrupted
    (earlier,) = list_runs(state)
    holder = other_run_holds_the_lease(fleet)
    try:
        assert main(apply_args(tmp_path, state)) == 1
    finally:
        holder.release()
    assert "held by rollout/someone-elses-run" in capsys.readouterr().err
    assert [r.run_id for r in list_runs(state)] == [earlier.run_id]
    assert [p.name for p in (state / "runs").iterdir()] == [earlier.run_id]
    listed = status(state, capsys, "--all").splitlines()
    assert len(listed) == 1 and listed[0].startswith(earlier.run_id)


def test_apply_holds_the_lease_before_its_run_exists(
    fleet: KubeClient,
    place: RunPlace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: dict[str, Any] = {}
    real_acquire = RunLease.acquire

    def acquire(lease: RunLease) -> None:
        seen["runs when the lease was taken"] = place.run_ids(fleet)
        real_acquire(lease)

    def execute(plan: Plan, spec: Spec, facts: object, _f: Any, journal: Journal, *_: Any) -> Any:
        seen["run_id"] = journal.run_id
        seen["holder"] = fleet.get_lease("kube-system", "rollout").holder_identity
        seen["invocation"] = journal.read_invocation()
        seen["plan"] = plan_from_data(json.loads(journal.read_plan_json()))
        seen["executed"] = plan
        return RunReport(RunOutcome.SUCCEEDED, "", {})

    monkeypatch.setattr(RunLease, "acquire", acquire)
    monkeypatch.setattr(cli_apply, "execute", execute)
    assert main(place.args) == 0
    assert seen["runs when the lease was taken"] == []
    pod = f"/{place.pod}" if place.pod else ""
    assert seen["holder"] == f"rollout/{seen['run_id']}{pod}"
    assert seen["invocation"] == Invocation(
        spec_source=str(PLAN),
        spec_text=PLAN.read_text(),
        inventory=str((tmp_path / "inventory.yaml").resolve()),
        kubeconfig=None,
        context=None,
        accept_new_host_keys=False,
    )
    assert seen["plan"] == seen["executed"]
    assert fleet.get_lease("kube-system", "rollout").holder_identity == "", "released after"
    assert f"run {seen['run_id']} ({place.kept}" in capsys.readouterr().err
    assert place.run_ids(fleet) == [seen["run_id"]]


def test_sigterm_stops_the_run_and_releases_the_lease(
    fleet: KubeClient,
    place: RunPlace,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGTERM (a pod deleted or past activeDeadlineSeconds, a service stopped) stops the run
    as Ctrl-C does: its journal kept where the run is, and the Lease free for the next run."""
    seen: dict[str, Any] = {}

    def execute(
        planned: Plan, spec: Spec, facts: object, connection: Any, journal: Journal, *_: Any
    ) -> RunReport:
        seen["run_id"] = journal.run_id
        seen["holder"] = connection.kube.get_lease("kube-system", "rollout").holder_identity
        journal.append(StepStarted("gpu-a-1", 0, "preflight", 1))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(cli_apply, "execute", execute)
    assert main(place.args) == 3
    assert "aborted" in capsys.readouterr().err
    assert seen["holder"].endswith(f"/{place.pod or seen['run_id']}")
    assert fleet.get_lease("kube-system", "rollout").holder_identity == ""  # released
    state = place.read_state(fleet, seen["run_id"])
    assert state.step_in_flight("gpu-a-1") is not None
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


# --- resume -----------------------------------------------------------------------------------


def test_resume_without_an_invocation_says_so(
    plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_run(tmp_path, plan) as journal:
        run_id = journal.run_id
    assert main(["resume", run_id, "--state-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot resume run {run_id}: ")
    assert f"{INVOCATION_FILE} is missing" in err and "rollout apply PLAN" in err


def test_resume_with_a_torn_invocation_says_so(
    plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    invocation = Invocation(str(PLAN), PLAN.read_text(), "/srv/inventory.yaml", None, None, False)
    with make_run(tmp_path, plan, invocation=invocation) as journal:
        run_id = journal.run_id
        path = journal.run_dir / INVOCATION_FILE
        path.write_bytes(path.read_bytes()[:40])
    assert main(["resume", run_id, "--state-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"error: cannot resume run {run_id}: {path} is not valid JSON" in err


def test_resume_of_a_run_cut_short_while_created_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "runs" / "20261129-231500-p-abcd"
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text("{}")
    assert main(["resume", run_dir.name, "--state-dir", str(tmp_path)]) == 1
    assert "nothing to resume" in capsys.readouterr().err


def test_a_resume_refused_by_the_lease_leaves_the_run_halted(
    fleet: KubeClient, plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    invocation = Invocation(
        str(PLAN), PLAN.read_text(), str(tmp_path / "inv.yaml"), None, None, False
    )
    with make_run(tmp_path, plan, invocation=invocation) as journal:
        journal.append(RunHalted(HALT_REASON))
        run_id, records = journal.run_id, len(journal.entries())
    holder = other_run_holds_the_lease(fleet)
    try:
        assert main(["resume", run_id, "--state-dir", str(tmp_path)]) == 1
    finally:
        holder.release()
    state = read_run(tmp_path, run_id)
    assert state.halted_reason == HALT_REASON and state.last_seq == records
    assert f"run {run_id}: halted: {HALT_REASON}" in status(tmp_path, capsys, run_id)


# --- status -----------------------------------------------------------------------------------


def test_status_says_a_halted_run_halted_and_why(
    plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_run(tmp_path, plan) as journal:
        journal.append(RunHalted(HALT_REASON))
        run_id = journal.run_id
        # halted, even while the process that halted it has not exited yet
        assert f"run {run_id}: halted: {HALT_REASON}; continue with `rollout resume {run_id}`" in (
            status(tmp_path, capsys, run_id)
        )
    out = status(tmp_path, capsys)
    assert out.startswith(f"run {run_id}: halted: {HALT_REASON};")
    assert "in progress" not in out and "interrupted" not in out
    assert f"{run_id}  {plan.name}  halted: {HALT_REASON}" in status(tmp_path, capsys, "--all")


def test_status_says_a_run_whose_process_died_was_interrupted(
    plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_run(tmp_path, plan) as journal:
        journal.append(StepStarted("gpu-a-1", 0, "preflight", 1))
        run_id = journal.run_id
    out = status(tmp_path, capsys, run_id)
    assert f"run {run_id}: interrupted (no process holds it); continue with" in out
    assert "gpu-a-1: pending; 0/" in out and "in flight: preflight" in out
    assert f"{run_id}  {plan.name}  interrupted" in status(tmp_path, capsys, "--all")


def test_status_says_a_run_held_by_a_live_process_is_running(
    plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_run(tmp_path, plan) as journal:
        run_id = journal.run_id
    holder = start_lock_holder(tmp_path, run_id)
    try:
        out = status(tmp_path, capsys, run_id)
        assert f"run {run_id}: running (pid {holder.pid} on " in out
        assert f"{run_id}  {plan.name}  running (pid {holder.pid}" in status(
            tmp_path, capsys, "--all"
        )
        # looking did not take the lock from it, nor block it
        (run,) = list_runs(tmp_path)
        assert run.holder is not None and run.holder.pid == holder.pid
    finally:
        kill_lock_holder(holder)
    # killed: the kernel dropped its lock, so the run is interrupted, not running
    assert f"run {run_id}: interrupted" in status(tmp_path, capsys, run_id)


def test_status_of_finished_runs_and_unreadable_ones(
    plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_run(tmp_path, plan) as journal:
        for node in plan.nodes:
            journal.append(CordonedByRollout(node.name))
        journal.append(StepStarted("gpu-a-1", 0, "preflight", 1))
        journal.append(StepFinished("gpu-a-1", 0, "preflight", 1, StepOutcome.DONE))
        journal.append(RunFinished(RunOutcome.FAILED))
        run_id = journal.run_id
    out = status(tmp_path, capsys, run_id)
    assert out.startswith(f"run {run_id}: failed\n")
    assert "  gpu-a-1: pending; 1/" in out and "cordoned by rollout" in out
    broken = tmp_path / "runs" / "20991231-000000-broken-0000"
    broken.mkdir()
    listed = status(tmp_path, capsys, "--all")
    assert f"{broken.name}    unreadable: run {broken.name} has no journal" in listed
    assert f"{run_id}  {plan.name}  failed" in listed


def test_status_reads_the_plan_through_its_digest(
    plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_run(tmp_path, plan) as journal:
        run_id = journal.run_id
        changed = plan_to_data(plan) | {"name": "something-else"}
        (journal.run_dir / PLAN_FILE).write_text(json.dumps(changed))
    assert main(["status", run_id, "--state-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{journal.run_dir / PLAN_FILE} does not match the plan run {run_id} started with" in err


def test_status_names_the_nodes_left_and_the_maintenance_window(
    plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = PLAN.read_text().replace(
        "policy:\n",
        'policy:\n  maintenance_window: {days: [fri], start: "22:00", end: "04:00", '
        "timezone: Europe/Berlin}\n",
    )
    invocation = Invocation(str(PLAN), text, "/srv/inventory.yaml", None, None, False)
    with make_run(tmp_path, plan, invocation=invocation) as journal:
        journal.append(RunHalted("window closed"))
        run_id = journal.run_id
    out = status(tmp_path, capsys, run_id)
    assert f"{len(plan.nodes)} node(s) left; the " in out
    # Thursday 2024-01-04 noon: the next opening is Friday 22:00 in Berlin
    thursday = datetime(2024, 1, 4, 12, 0, tzinfo=UTC)
    assert window_note(text, str(PLAN), thursday) == (
        "; the next maintenance window opens Fri 2024-01-05 22:00 CET"
    )
    saturday_early = datetime(2024, 1, 6, 1, 0, tzinfo=UTC)  # 02:00 in Berlin
    assert window_note(text, str(PLAN), saturday_early) == (
        "; the maintenance window is open until 04:00 CET"
    )
