"""`rollout apply` and `rollout resume` end to end on a fresh lab per test: real SSH, systemd and
containerd 1.6/1.7/2.1 on the nodes, the API emulator through the official client."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.lease import RunLease
from rollout.run import list_runs, read_run
from rollout.transports.errors import NotFound
from rollout.transports.kube import ConfigMap, KubeClient
from tests.examples import PLAN
from tests.lab.converged import HANDLERS, assert_converged, dump_of, handlers_and_config_path
from tests.lab.labapi import apply_args, apply_killed_when, fleet_args, wait_for, watching
from tests.lab.test_cluster_shared import own_lab, ssh_check
from tests.planning import time_slicing_plan
from tests.podbudgets import create_pod_budget

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

# How long the lab's simulated cluster may take to react (it takes seconds).
WAIT_S = 30.0


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """A lab of its own for each test: apply changes nodes for good."""
    with own_lab(tmp_path / "lab", ("1.6", "1.7", "2.1", "1.7"), gpus=2) as built:
        yield built


def test_registry_mirror_on_a_mixed_fleet(
    lab: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(apply_args(lab, PLAN, tmp_path / "state")) == 0
    assert_converged(lab, kube)
    (run,) = list_runs(tmp_path / "state")
    state = read_run(tmp_path / "state", run.run_id)
    for spec in lab.nodes:
        node = state.node(spec.name)
        assert node.outcome is not None and node.outcome.value == "succeeded"
        assert node.backups, "every replaced file is backed up first"
    # no smoke pod is left behind
    assert not [p for p in kube.list_pods(None) if p.name.startswith("rollout-smoke")]
    # a second apply finds nothing to do
    capsys.readouterr()
    assert main(apply_args(lab, PLAN, tmp_path / "state")) == 0
    assert "No changes." in capsys.readouterr().out


def test_upgrade_failed_label_halts_before_any_write(
    lab: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    last = lab.nodes[-1].name
    # a failed driver upgrade as `lab break` leaves it (the label alone would clear itself:
    # the upgrade controller clears upgrade-failed once the driver pod is in sync and Ready)
    assert main(["lab", "break", "upgrade-failed", last, "--lab-dir", str(lab.lab_dir)]) == 0
    before = {n.name: dump_of(lab, n.name) for n in lab.nodes}
    capsys.readouterr()
    assert main([*apply_args(lab, PLAN, tmp_path / "state"), "--output", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["outcome"] == "halted" and last in report["halt_reason"]
    assert report["nodes"] and all(n["outcome"] == "pending" for n in report["nodes"].values())
    (run,) = list_runs(tmp_path / "state")
    assert run.halted_reason and last in run.halted_reason
    assert {n.name: dump_of(lab, n.name) for n in lab.nodes} == before


def test_node_cordoned_by_hand_stays_cordoned(lab: Lab, kube: KubeClient, tmp_path: Path) -> None:
    first = lab.nodes[0].name
    kube.set_unschedulable(first, True)
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.read_text().replace("max_unavailable: 1", "max_unavailable: 2"))
    assert main(apply_args(lab, plan, tmp_path / "state")) == 0
    assert kube.get_node(first).unschedulable, "someone else's cordon is kept"
    handlers, path = handlers_and_config_path(dump_of(lab, first))
    assert handlers >= HANDLERS and path == "/etc/containerd/certs.d"
    assert not any(kube.get_node(n.name).unschedulable for n in lab.nodes[1:])


def test_failed_containerd_start_rolls_back_and_halts(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    # the second node (first of wave 2) cannot start containerd after the write
    victim = next(n for n in lab.nodes if n.name == "lab-node-2")
    dropin = "/etc/systemd/system/containerd.service.d/90-test-broken.conf"
    later = [n.name for n in lab.nodes if n.name not in ("lab-node-1", "lab-node-2")]
    before_victim = dump_of(lab, victim.name)
    before_later = {name: dump_of(lab, name) for name in later}
    ssh_check(
        lab,
        victim,
        ["sh", "-c", f"cat > {dropin} && systemctl daemon-reload"],
        stdin=b"[Service]\nExecStartPre=/bin/false\n",
    )
    assert main(apply_args(lab, PLAN, tmp_path / "state")) == 1
    (run,) = list_runs(tmp_path / "state")
    state = read_run(tmp_path / "state", run.run_id)
    outcome = state.node(victim.name).outcome
    assert run.halted_reason and victim.name in run.halted_reason
    # the rollback restarts containerd too: with the start still broken it cannot succeed,
    # so the node is left cordoned with the reason recorded
    assert outcome is not None and outcome.value in ("rolled-back", "left-cordoned")
    ssh_check(lab, victim, ["sh", "-c", f"rm -f {dropin} && systemctl daemon-reload"])
    for name in later:
        assert state.node(name).outcome is None, "later nodes untouched"
        assert dump_of(lab, name) == before_later[name]
    # the victim's files are the originals again
    ssh_check(lab, victim, ["systemctl", "restart", "containerd"])
    assert dump_of(lab, victim.name) == before_victim


def test_second_concurrent_apply_is_refused_by_the_lease(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    holder = RunLease(kube, "rollout/someone-elses-run", renew_every_s=3600)
    holder.acquire()
    try:
        assert main(apply_args(lab, PLAN, tmp_path / "state")) == 1
    finally:
        holder.release()
    # refused before any run was created: nothing to resume, nothing listed
    assert list_runs(tmp_path / "state") == []


def journal_lines(state: Path) -> int:
    runs = list(state.glob("runs/*/journal.jsonl"))
    return sum(1 for _ in runs[0].open()) if runs else 0


def run_killed_after(lab: Lab, state: Path, lines: int) -> None:
    """Start apply in a subprocess and SIGKILL it once the journal has `lines` records."""
    apply_killed_when(lab, PLAN, state, lambda: journal_lines(state) >= lines, timeout_s=300)


@pytest.mark.parametrize("kill_after", [4, 17, 40])
def test_kill_then_resume_converges(
    lab: Lab, kube: KubeClient, tmp_path: Path, kill_after: int
) -> None:
    state = tmp_path / "state"
    run_killed_after(lab, state, kill_after)
    (run,) = list_runs(state)
    assert main(["resume", run.run_id, "--state-dir", str(state)]) == 0
    assert_converged(lab, kube)
    final = read_run(state, run.run_id)
    assert final.outcome is not None and final.outcome.value == "succeeded"
    entries = [json.loads(line) for line in (run.run_dir / "journal.jsonl").open()]
    writes = [
        e
        for e in entries
        if e.get("kind") == "step-finished"
        and e.get("step") == "containerd.write"
        and e.get("outcome") == "done"
    ]
    # each node's files are written once: a resumed run does not redo finished steps
    assert len({e["node"] for e in writes}) == len(writes) == len(lab.nodes)


def names(nodes: Sequence[Any]) -> list[str]:
    return [n.name for n in nodes]


TIME_SLICING = time_slicing_plan(
    name="share-gpus",
    targets="{selector: nvidia.com/gpu.present=true}",
    profile="shared-4x",
    policy='policy:\n  waves: [1, "100%"]\n',
)


def test_time_slicing_replicas_multiply_allocatable(
    lab: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(TIME_SLICING)
    other = {"other-profile": "version: v1\n"}
    try:
        current = kube.get_configmap("gpu-operator", "time-slicing-config")
        kube.replace_configmap(current.with_data({**current.data, **other}))
    except NotFound:
        kube.create_configmap(ConfigMap("gpu-operator", "time-slicing-config", other))
    capsys.readouterr()
    assert main(["plan", str(plan), *fleet_args(lab), "--output", "json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main(apply_args(lab, plan, tmp_path / "state")) == 0
    # the plan's capacity forecast is what the nodes advertise once the plan is applied
    for node_plan in (n for wave in planned["waves"] for n in wave["nodes"]):
        advertised = kube.get_node(node_plan["name"]).allocatable
        forecast = node_plan["capacity"]["resources"]
        assert {r["resource"]: str(r["after"]) for r in forecast} == {
            r["resource"]: advertised.get(r["resource"], "0") for r in forecast
        }, node_plan["name"]
    fleet = {r["resource"]: r["after"] for r in planned["capacity"]["resources"]}
    assert fleet["nvidia.com/gpu"] == sum(len(s.gpus) * 4 for s in lab.nodes)
    for spec in lab.nodes:
        node = kube.get_node(spec.name)
        assert node.allocatable.get("nvidia.com/gpu") == str(len(spec.gpus) * 4), spec.name
        assert node.labels.get("nvidia.com/device-plugin.config") == "shared-4x"
        assert not node.unschedulable, "time-slicing drains nothing and cordons nothing"
    data = kube.get_configmap("gpu-operator", "time-slicing-config").data
    assert "replicas: 4" in data["shared-4x"]
    assert data["other-profile"] == "version: v1\n", "other profiles are kept"


WAVE_BY_WAVE = TIME_SLICING.replace('waves: [1, "100%"]', "waves: [1, 1, 2]")


def test_time_slicing_changes_each_node_only_in_its_own_wave(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    """Safety invariant 8: with no ConfigMap yet (the profile would be its only key, which
    every unlabelled node falls back to), a node's advertised GPUs change only once its own
    wave labels it. Watched from the side through the API while the run goes."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(WAVE_BY_WAVE)
    with pytest.raises(NotFound):
        kube.get_configmap("gpu-operator", "time-slicing-config")
    physical = {spec.name: str(len(spec.gpus)) for spec in lab.nodes}
    wait_for(
        lambda: {n.name: n.capacity.get("nvidia.com/gpu") for n in kube.list_nodes()} == physical,
        WAIT_S,
        what="the lab's nodes to advertise their GPUs",
        interval_s=0.2,
    )

    # (node, its profile label, advertised nvidia.com/gpu, the ClusterPolicy points at a config)
    def sample(side: KubeClient) -> list[tuple[str, str | None, str | None, bool]]:
        policy = side.list_cluster_policies()[0]["spec"]["devicePlugin"]["config"]
        return [
            (
                node.name,
                node.labels.get("nvidia.com/device-plugin.config"),
                node.capacity.get("nvidia.com/gpu"),
                bool(policy.get("name")),
            )
            for node in side.list_nodes()
        ]

    with watching(lab, sample, interval_s=0.1) as seen:
        assert main(apply_args(lab, plan, tmp_path / "state")) == 0
    changed_early = [
        (name, gpus) for name, label, gpus, _ in seen if label is None and gpus != physical[name]
    ]
    assert changed_early == [], "a node's GPUs changed before its wave labelled it"
    # the watch did see the window that matters: published, some nodes not yet labelled
    assert any(published and label is None for _, label, _, published in seen)
    for spec in lab.nodes:
        assert kube.get_node(spec.name).capacity.get("nvidia.com/gpu") == str(len(spec.gpus) * 4)
    data = kube.get_configmap("gpu-operator", "time-slicing-config").data
    assert set(data) == {"shared-4x", "default"} and "sharing" not in data["default"]

    # the lab's config-manager: a label naming no key stops the device plugin
    first = lab.nodes[0].name
    kube.patch_node_labels(first, {"nvidia.com/device-plugin.config": "no-such-profile"})
    wait_for(
        lambda: kube.get_node(first).allocatable.get("nvidia.com/gpu") == "0",
        WAIT_S,
        what="the device plugin to stop",
        interval_s=0.2,
    )
    plugins = kube.list_pods(
        "gpu-operator",
        label_selector="app=nvidia-device-plugin-daemonset",
        field_selector=f"spec.nodeName={first}",
    )
    assert [p.phase for p in plugins] == ["Failed"] and "no-such-profile" in plugins[0].message
    kube.patch_node_labels(first, {"nvidia.com/device-plugin.config": None})
    wait_for(
        lambda: kube.get_node(first).allocatable.get("nvidia.com/gpu") == physical[first],
        WAIT_S,
        what="the device plugin to come back",
        interval_s=0.2,
    )


def test_drain_blocked_by_a_budget_fails_naming_it(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:

    first = lab.nodes[0].name
    kube.create_pod(
        "default",
        {
            "metadata": {
                "name": "db-0",
                "labels": {"app": "db"},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "StatefulSet",
                        "name": "db",
                        "uid": "0b6f2f4c-1b1e-4d3a-9b7a-3f3f3f3f3f3f",
                        "controller": True,
                    }
                ],
            },
            "spec": {"nodeName": first, "containers": [{"name": "db", "image": "postgres:16"}]},
        },
    )
    create_pod_budget(kube, "default", "db-pdb", "db")
    wait_for(
        lambda: kube.get_pod("default", "db-0").phase == "Running",
        WAIT_S,
        what="pod default/db-0 to run",
        interval_s=0.2,
    )
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        PLAN.read_text().replace(
            "on_failure: rollback", "on_failure: rollback\n  drain: {timeout_s: 3}"
        )
    )
    before = dump_of(lab, first)
    assert main(apply_args(lab, plan, tmp_path / "state")) == 1
    (run,) = list_runs(tmp_path / "state")
    state = read_run(tmp_path / "state", run.run_id)
    node = state.node(first)
    assert node.outcome is not None and node.outcome.value == "rolled-back"
    assert "PodDisruptionBudget default/db-pdb" in node.outcome_reason
    assert dump_of(lab, first) == before, "nothing was written"
    assert not kube.get_node(first).unschedulable, "rollout's own cordon was undone"
    assert kube.get_pod("default", "db-0").phase == "Running"


def test_preflight_refuses_a_node_whose_containerd_is_down(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    first = lab.nodes[0]
    ssh_check(lab, first, ["systemctl", "stop", "containerd"])
    before = dump_of(lab, first.name)  # `config dump` reads the files; no daemon needed
    assert main(apply_args(lab, PLAN, tmp_path / "state")) == 1
    (run,) = list_runs(tmp_path / "state")
    node = read_run(tmp_path / "state", run.run_id).node(first.name)
    assert node.outcome is not None and node.outcome.value == "rolled-back"
    assert "containerd is not running before any change" in node.outcome_reason
    assert [c.kind for c in node.completed] == [], "refused before the first change"
    assert dump_of(lab, first.name) == before
    assert not kube.get_node(first.name).unschedulable
