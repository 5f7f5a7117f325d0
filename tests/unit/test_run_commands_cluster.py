"""`rollout apply --yes` in the scheduled pod (a service account, no kubeconfig, no state
directory): its run is kept in the cluster, the next pod's apply continues that run from the
stored plan, a changed plan is refused, and `rollout status --schedule` reads it. What apply
does alike in a pod and with a state directory (the Lease, SIGTERM) is tested for both in
test_run_commands.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import rollout.cli.apply as cli_apply
from rollout.cli import main
from rollout.executor import RunReport
from rollout.plan import Plan, plan_from_data
from rollout.run import Journal, RunFinished, RunHalted, RunOutcome
from rollout.run.cluster import find_run, journal_text
from rollout.spec import Spec
from rollout.transports.kube import ConfigMap, KubeClient
from tests.kubeconfigs import write_kubeconfig
from tests.unit import runfakes
from tests.unit.runfakes import NAMESPACE, PLAN, POD, apply_args, run_node

# the run commands' fixtures, shared with test_run_commands.py
kube, plan, fleet, in_pod = runfakes.kube, runfakes.plan, runfakes.fleet, runfakes.in_pod


def window_closes_after(first: str, seen: dict[str, Any]):  # type: ignore[no-untyped-def]
    """An executor that does `first` (if still pending) and stops as at the window's end."""

    def execute(  # type: ignore[no-untyped-def]
        planned: Plan, spec: Spec, facts: object, connection: Any, journal: Journal, *_: Any
    ):
        seen.setdefault("runs", []).append(journal.run_id)
        seen.setdefault("plans", []).append(planned)
        seen["holder"] = connection.kube.get_lease("kube-system", "rollout").holder_identity
        state = journal.replay()
        for node in planned.nodes:
            if state.node(node.name).outcome is not None:
                continue
            if node.name != first:
                journal.append(RunHalted("window closed (22:00-23:00 UTC): 1 node(s) left"))
                state = journal.replay()
                outcomes = {n.name: state.node(n.name).outcome for n in planned.nodes}
                nodes = {n: (o.value if o else "pending", "") for n, o in outcomes.items()}
                return RunReport(RunOutcome.HALTED, "window closed", nodes, window_closed=True)
            run_node(journal, node.name, tuple(step.kind for step in node.steps))
        journal.append(RunFinished(RunOutcome.SUCCEEDED))
        return RunReport(RunOutcome.SUCCEEDED, "", {})

    return execute


@pytest.fixture
def first_run(
    fleet: KubeClient,
    in_pod: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> dict[str, Any]:
    """The first scheduled run: gpu-a-1 done, then the window closes (exit 4). What the
    executor saw, and the run's progress lines under "err"."""
    seen: dict[str, Any] = {}
    # what rollout schedule applied: the plan's ConfigMap, which the run's Events are on
    fleet.create_configmap(ConfigMap(NAMESPACE, "rollout-registry-mirror", {"plan.yaml": ""}))
    monkeypatch.setattr(cli_apply, "execute", window_closes_after("gpu-a-1", seen))
    assert main(apply_args(tmp_path)) == 4
    seen["err"] = capsys.readouterr().err
    return seen


def test_the_next_scheduled_run_continues_the_run_kept_in_the_cluster(
    fleet: KubeClient,
    plan: Plan,
    first_run: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen = first_run
    (run_id,) = seen["runs"]
    assert seen["holder"] == f"rollout/{run_id}/{POD}"
    assert f"run {run_id} (kept in secret rollout/rollout-registry-mirror-run" in seen["err"]
    assert not (tmp_path / "home" / ".local").exists()  # nothing kept in the pod

    # the next pod: the stored plan, not a new one, and the same run
    def no_planning(*_: Any) -> Plan:
        raise AssertionError("a continued run follows its stored plan")

    monkeypatch.setattr(cli_apply, "build_plan", no_planning)
    monkeypatch.setattr(cli_apply, "execute", window_closes_after("gpu-a-2", seen))
    assert main(apply_args(tmp_path)) == 0
    assert seen["runs"] == [run_id, run_id]
    assert seen["plans"][1] == plan
    assert f"continuing run {run_id} (secret rollout/rollout-registry-mirror-run)" in (
        capsys.readouterr().err
    )
    found = find_run(fleet, NAMESPACE, "registry-mirror")
    assert found is not None and found.state.outcome is RunOutcome.SUCCEEDED
    kinds = [json.loads(line)["kind"] for line in journal_text(found.secret).splitlines()]
    assert kinds.count("run-started") == 1 and kinds.count("run-resumed") == 1
    assert kinds.count("node-finished") == 2  # no node done twice
    assert plan_from_data(json.loads(found.read_plan_json())) == plan
    # each stop said on the plan's ConfigMap, as kubectl describe configmap shows them
    uid = fleet.get_configmap(NAMESPACE, "rollout-registry-mirror").uid
    selector = f"involvedObject.kind=ConfigMap,involvedObject.uid={uid}"
    said = {(e.reason, e.message) for e in fleet.list_events(NAMESPACE, field_selector=selector)}
    assert said == {
        (
            "WindowClosed",
            f"run {run_id}: window closed, 1 node(s) left: the next scheduled run continues",
        ),
        ("RolloutDone", f"run {run_id}: every node done"),
    }


def test_a_changed_plan_is_refused_while_its_run_is_unfinished(
    first_run: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    changed = tmp_path / "plan.yaml"
    changed.write_text(PLAN.read_text() + "# edited\n")
    capsys.readouterr()
    assert main(apply_args(tmp_path, plan_file=changed)) == 2
    err = capsys.readouterr().err
    (run_id,) = first_run["runs"]
    assert f"{changed} is not the plan that run {run_id} started with" in err
    assert "(1 node(s) finished)" in err
    assert "kubectl delete secret -n rollout rollout-registry-mirror-run" in err


def test_status_reads_the_scheduled_run_from_the_cluster(
    fleet: KubeClient,
    first_run: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (run_id,) = first_run["runs"]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fleet.server)
    capsys.readouterr()
    args = ["status", "--schedule", "registry-mirror", "--kubeconfig", str(kubeconfig)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"run {run_id} (secret rollout/rollout-registry-mirror-run): halted: window" in out
    assert "the next scheduled run continues it" in out
    assert "gpu-a-1: succeeded" in out and "gpu-a-2: pending" in out
    assert "1 node(s) left" in out
    assert main([*args[:2], "other-plan", *args[3:]]) == 0
    assert "no run of plan other-plan kept in the cluster" in capsys.readouterr().out


def test_a_pod_without_its_namespace_file_says_what_to_do(
    fleet: KubeClient,
    in_pod: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (in_pod / "namespace").unlink()
    assert main(apply_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"{in_pod}/namespace is missing or empty" in err and "--state-dir" in err
