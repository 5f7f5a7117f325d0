"""`rollout apply --yes` in the scheduled pod (a service account, no kubeconfig, no state
directory): its run is kept in the cluster, the next pod's apply continues that run from the
stored plan, a changed plan is refused, and `rollout status --schedule` reads it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import rollout.cli.apply as cli_apply
from rollout.cli import main
from rollout.executor import RunReport
from rollout.plan import Plan, plan_from_data
from rollout.run import (
    Journal,
    NodeFinished,
    NodeOutcome,
    RunFinished,
    RunHalted,
    RunOutcome,
    StepFinished,
    StepOutcome,
    StepStarted,
)
from rollout.run.cluster import find_run, journal_text
from rollout.spec import Spec
from rollout.transports.kube import ConfigMap, KubeClient, incluster
from tests.kubeconfigs import write_kubeconfig
from tests.unit.test_run_commands import PLAN, fleet, kube, plan  # noqa: F401 - fixtures

NAMESPACE = "rollout"
POD = "rollout-registry-mirror-29000000-abcde"


@pytest.fixture
def in_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The pod's environment as rollout reads it: a service account, no kubeconfig."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "namespace").write_text(NAMESPACE + "\n")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("ROLLOUT_STATE_DIR", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(incluster, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setattr(cli_apply.socket, "gethostname", lambda: POD)
    return account


def pod_apply(tmp_path: Path, plan_file: Path = PLAN) -> list[str]:
    inventory = tmp_path / "inventory.yaml"
    return ["apply", str(plan_file), "-i", str(inventory), "--yes", "--output", "json"]


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
            for index, step in enumerate(node.steps):
                journal.append(StepStarted(node.name, index, step.kind, 1))
                journal.append(StepFinished(node.name, index, step.kind, 1, StepOutcome.DONE))
            journal.append(NodeFinished(node.name, NodeOutcome.SUCCEEDED))
        journal.append(RunFinished(RunOutcome.SUCCEEDED))
        return RunReport(RunOutcome.SUCCEEDED, "", {})

    return execute


@pytest.fixture
def first_run(
    fleet: KubeClient,  # noqa: F811
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
    assert main(pod_apply(tmp_path)) == 4
    seen["err"] = capsys.readouterr().err
    return seen


def test_the_next_scheduled_run_continues_the_run_kept_in_the_cluster(
    fleet: KubeClient,  # noqa: F811
    plan: Plan,  # noqa: F811
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
    assert main(pod_apply(tmp_path)) == 0
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
    fleet: KubeClient,  # noqa: F811
    first_run: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    changed = tmp_path / "plan.yaml"
    changed.write_text(PLAN.read_text() + "# edited\n")
    capsys.readouterr()
    assert main(pod_apply(tmp_path, changed)) == 2
    err = capsys.readouterr().err
    (run_id,) = first_run["runs"]
    assert f"{changed} is not the plan that run {run_id} started with" in err
    assert "(1 node(s) finished)" in err
    assert "kubectl delete secret -n rollout rollout-registry-mirror-run" in err


def test_status_reads_the_scheduled_run_from_the_cluster(
    fleet: KubeClient,  # noqa: F811
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


def test_sigterm_stops_the_run_and_releases_the_lease(
    fleet: KubeClient,  # noqa: F811
    in_pod: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The pod deleted (or past activeDeadlineSeconds) gets SIGTERM: the run stops as at
    Ctrl-C, its journal kept in the cluster, and the Lease is free for the next run."""
    seen: dict[str, Any] = {}

    def execute(
        planned: Plan, spec: Spec, facts: object, connection: Any, journal: Journal, *_: Any
    ) -> RunReport:
        seen["holder"] = connection.kube.get_lease("kube-system", "rollout").holder_identity
        journal.append(StepStarted("gpu-a-1", 0, "preflight", 1))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(cli_apply, "execute", execute)
    assert main(pod_apply(tmp_path)) == 3
    assert "aborted" in capsys.readouterr().err
    assert seen["holder"].endswith(f"/{POD}")
    assert fleet.get_lease("kube-system", "rollout").holder_identity == ""  # released
    found = find_run(fleet, NAMESPACE, "registry-mirror")
    assert found is not None and found.state.step_in_flight("gpu-a-1") is not None
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_a_pod_without_its_namespace_file_says_what_to_do(
    fleet: KubeClient,  # noqa: F811
    in_pod: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (in_pod / "namespace").unlink()
    assert main(pod_apply(tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"{in_pod}/namespace is missing or empty" in err and "--state-dir" in err
