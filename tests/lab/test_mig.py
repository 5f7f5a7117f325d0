"""MIG reconfiguration in the lab, end to end: `rollout plan` and `rollout apply` of a `mig`
change against the lab's MIG manager and MIG-capable stand-in GPUs (two containerd 1.7 nodes
of two A100-SXM4-40GB each): a mixed-strategy layout in two waves whose forecast is what the
nodes advertise after (all-balanced as the GPU Operator ships it, one entry per GPU model by
PCI device id: each node gets the A100-40GB entry its nvidia-smi's ids select), a layout
whose MIG mode change needs a real reboot, a MIG manager that reports `failed` (the node
rolled back, the run halted), kill -9 during mig.wait then `rollout resume`, and `plan`
refusing an unknown layout.

Each test leaves the lab as it found it: every node on layout all-disabled (state success),
strategy single, scenarios healed, nodes schedulable.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.run import list_runs, read_run
from rollout.steps.nodemarks import LEFT_CORDONED_ANNOTATION, STEP_ANNOTATION
from rollout.transports.kube import KubeClient
from tests.lab.labapi import apply_args, apply_killed_when, fleet_args, wait_for
from tests.lab.test_cluster_shared import own_lab, ssh_check

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
POLICY = "cluster-policy"
# generous: the machine running the suite may be loaded; a hang fails here, not in CI's limit
WAIT_S = 300.0
APPLY_S = 600.0
MIG_UUID = re.compile(r"MIG-[0-9a-f][0-9a-f-]+")


def mig_plan(layout: str, targets: str, waves: str = "[1, 1]") -> str:
    return (
        "apiVersion: rollout/v1\nkind: Plan\nmetadata: {name: mig}\n"
        f"targets: {targets}\n"
        f"changes:\n  - mig: {{config: {layout}}}\n"
        f"policy:\n  waves: {waves}\n  max_unavailable: 1\n  on_failure: rollback\n"
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("mig") / "lab", ("1.7", "1.7"), gpus=2) as built:
        yield built


def set_strategy(kube: KubeClient, strategy: str) -> None:
    kube.patch_cluster_policy(POLICY, {"spec": {"mig": {"strategy": strategy}}})


def wait_for_layout(kube: KubeClient, node: str, layout: str) -> None:
    wait_for(
        lambda: (
            kube.get_node(node).labels.get(STATE) == "success"
            and kube.get_node(node).labels.get(CONFIG) == layout
        ),
        WAIT_S,
        what=f"{node} on MIG layout {layout} (state success)",
    )


@pytest.fixture
def restored(lab: Lab, kube: KubeClient) -> Iterator[Lab]:
    """The lab as the test found it afterwards: scenarios healed, every node on all-disabled,
    strategy single, schedulable and unmarked."""
    yield lab
    assert main(["lab", "heal", "--lab-dir", str(lab.lab_dir)]) == 0
    set_strategy(kube, "single")
    for spec in lab.nodes:
        labels = kube.get_node(spec.name).labels
        if (labels.get(CONFIG), labels.get(STATE)) != ("all-disabled", "success"):
            # the manager acts on a new label only: away and back, its old state gone with it
            kube.patch_node_labels(spec.name, {CONFIG: None})
            kube.patch_node_labels(spec.name, {CONFIG: "all-disabled", STATE: "pending"})
    for spec in lab.nodes:
        wait_for_layout(kube, spec.name, "all-disabled")
        whole = {"nvidia.com/gpu": len(spec.gpus)}
        wait_for(
            partial(advertises, kube, spec.name, whole),
            WAIT_S,
            what=f"{spec.name} advertising its whole GPUs",
        )
        kube.set_unschedulable(spec.name, False)
        kube.patch_node_annotations(
            spec.name, {LEFT_CORDONED_ANNOTATION: None, STEP_ANNOTATION: None}
        )


def plan_json(
    lab: Lab, plan: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["plan", str(plan), *fleet_args(lab), "--output", "json"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if out.strip() else {})


def journal_entries(state: Path) -> list[dict[str, Any]]:
    entries = []
    for path in state.glob("runs/*/journal.jsonl"):
        for line in path.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line being written
    return entries


def journal_results(state: Path, step: str) -> list[dict[str, Any]]:
    return [
        e
        for e in journal_entries(state)
        if e.get("kind") == "step-finished" and e.get("step") == step
    ]


def advertises(kube: KubeClient, name: str, resources: dict[str, int]) -> bool:
    """The node's allocatable is `resources`, resource by resource (absent: 0)."""
    node = kube.get_node(name)
    return {r: int(node.allocatable.get(r, "0")) for r in resources} == resources


def assert_forecast_advertised(kube: KubeClient, planned: dict[str, Any]) -> None:
    """Every node advertises what the plan's forecast said, resource by resource."""
    for node_plan in (n for wave in planned["waves"] for n in wave["nodes"]):
        name = node_plan["name"]
        forecast = {r["resource"]: r["after"] for r in node_plan["capacity"]["resources"]}
        wait_for(
            partial(advertises, kube, name, forecast),
            60.0,
            what=f"{name} advertising {forecast}",
        )


def test_a_mixed_layout_in_two_waves_advertises_its_forecast(
    restored: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    set_strategy(kube, "mixed")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        mig_plan("all-balanced", "{selector: nvidia.com/mig.capable=true}", '[1, "100%"]')
    )
    code, planned = plan_json(restored, plan, capsys)
    assert code == 0, planned
    assert [len(w["nodes"]) for w in planned["waves"]] == [1, 1]
    first = planned["waves"][0]["nodes"][0]
    steps = {s["kind"]: s for s in first["steps"]}
    assert steps["mig.configure"]["action"] == f"{CONFIG} all-disabled -> all-balanced"
    fleet = {r["resource"]: (r["before"], r["after"]) for r in planned["capacity"]["resources"]}
    assert fleet == {
        "nvidia.com/gpu": (4, 0),
        "nvidia.com/mig-1g.5gb": (0, 8),
        "nvidia.com/mig-2g.10gb": (0, 4),
        "nvidia.com/mig-3g.20gb": (0, 4),
    }
    # all-balanced is the GPU Operator's: one entry per GPU model, by PCI device id; each
    # A100-40GB node gets that model's entry, read from its nvidia-smi
    configmap = kube.get_configmap("gpu-operator", "default-mig-parted-config")
    layouts = yaml.safe_load(configmap.data["config.yaml"])["mig-configs"]
    assert ["0x20B010DE" in e["device-filter"] for e in layouts["all-balanced"]] == [True, False]
    for node_plan in (n for wave in planned["waves"] for n in wave["nodes"]):
        query = ["nvidia-smi", "--query-gpu=index,pci.device_id", "--format=csv,noheader"]
        ids = ssh_check(restored, restored.find_node(node_plan["name"]), query)
        assert ids == "0, 0x20B010DE\n1, 0x20B010DE\n"
        resources = node_plan["capacity"]["resources"]
        forecast = {r["resource"]: (r["before"], r["after"]) for r in resources}
        assert forecast == {
            "nvidia.com/gpu": (2, 0),
            "nvidia.com/mig-1g.5gb": (0, 4),
            "nvidia.com/mig-2g.10gb": (0, 2),
            "nvidia.com/mig-3g.20gb": (0, 2),
        }
    state = tmp_path / "state"
    assert main(apply_args(restored, plan, state)) == 0
    for spec in restored.nodes:
        node = kube.get_node(spec.name)
        assert (node.labels.get(CONFIG), node.labels.get(STATE)) == ("all-balanced", "success")
        assert not node.unschedulable
    assert_forecast_advertised(kube, planned)
    smokes = journal_results(state, "gpu.smoke")
    assert len(smokes) == 2
    assert all(MIG_UUID.search(e.get("detail", "")) for e in smokes), smokes


def test_a_layout_needing_a_reboot_converges_after_a_real_reboot(
    restored: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    node = restored.nodes[0]
    assert main(["lab", "break", "mig-mode-needs-reboot", node.name, "--lab-dir",
                 str(restored.lab_dir)]) == 0  # fmt: skip
    boot_before = ssh_check(restored, node, ["cat", "/proc/sys/kernel/random/boot_id"]).strip()
    plan = tmp_path / "plan.yaml"
    plan.write_text(mig_plan("all-1g.5gb", f"{{nodes: [{node.name}]}}", "[1]"))
    state = tmp_path / "state"
    assert main(apply_args(restored, plan, state)) == 0
    boot_after = ssh_check(restored, node, ["cat", "/proc/sys/kernel/random/boot_id"]).strip()
    assert boot_after != boot_before
    (waited,) = journal_results(state, "mig.wait")
    # the boot mig.wait proved is the first after the change (the node may boot again since)
    assert f"rebooted (boot_id {boot_before[:8]} -> " in waited["detail"]
    labels = kube.get_node(node.name).labels
    assert (labels.get(CONFIG), labels.get(STATE)) == ("all-1g.5gb", "success")
    assert kube.get_node(node.name).allocatable.get("nvidia.com/gpu") == "14"


def test_a_failed_mig_manager_rolls_the_node_back_and_halts(
    restored: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = (n.name for n in restored.nodes)
    assert main(["lab", "break", "mig-manager-failed", first, "--lab-dir",
                 str(restored.lab_dir)]) == 0  # fmt: skip
    plan = tmp_path / "plan.yaml"
    plan.write_text(mig_plan("all-1g.5gb", f"{{nodes: [{first}, {second}]}}"))
    state = tmp_path / "state"
    capsys.readouterr()
    assert main(apply_args(restored, plan, state)) == 1
    out, err = capsys.readouterr()
    (run,) = list_runs(state)
    assert run.halted_reason and first in run.halted_reason
    said = out + err
    assert "the MIG manager reports nvidia.com/mig.config.state=failed for layout" in said
    # it quotes the tail of the node's MIG manager pod's log, the manager's own failure
    assert "no MIG manager pod" not in said
    assert "nvidia-mig-manager-" in said and "Unable to apply MIG config" in said
    outcome = read_run(state, run.run_id).node(first).outcome
    assert outcome is not None and outcome.value == "rolled-back"
    labels = kube.get_node(first).labels
    assert (labels.get(CONFIG), labels.get(STATE)) == ("all-disabled", "success")
    assert not kube.get_node(first).unschedulable, "rolled back whole: uncordoned"
    assert kube.get_node(second).labels.get(CONFIG) == "all-disabled", "the run halted first"
    assert read_run(state, run.run_id).node(second).outcome is None


def test_kill_during_the_wait_then_resume_converges(
    restored: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    node = restored.nodes[1]
    # the MIG manager reboots the node for this layout: mig.wait lasts long enough to be killed
    assert main(["lab", "break", "mig-mode-needs-reboot", node.name, "--lab-dir",
                 str(restored.lab_dir)]) == 0  # fmt: skip
    plan = tmp_path / "plan.yaml"
    plan.write_text(mig_plan("all-3g.20gb", f"{{nodes: [{node.name}]}}", "[1]"))
    state = tmp_path / "state"

    def waiting() -> bool:
        return any(
            e.get("kind") == "step-started" and e.get("step") == "mig.wait"
            for e in journal_entries(state)
        )

    status = apply_killed_when(restored, plan, state, waiting, timeout_s=APPLY_S)
    assert status == -signal.SIGKILL, f"the apply ended by itself ({status}) before mig.wait"
    assert kube.get_node(node.name).labels.get(CONFIG) == "all-3g.20gb"
    (run,) = list_runs(state)
    assert main(["resume", run.run_id, "--state-dir", str(state)]) == 0
    final = read_run(state, run.run_id)
    assert final.outcome is not None and final.outcome.value == "succeeded"
    labels = kube.get_node(node.name).labels
    assert (labels.get(CONFIG), labels.get(STATE)) == ("all-3g.20gb", "success")
    assert kube.get_node(node.name).allocatable.get("nvidia.com/gpu") == "4"
    assert not kube.get_node(node.name).unschedulable
    configured = [e for e in journal_results(state, "mig.configure") if e.get("outcome") == "done"]
    assert len(configured) == 1, "the label is set once"


def mig_labels(kube: KubeClient, node: str) -> dict[str, str]:
    """The node's MIG manager labels (feature discovery's own follow the GPUs, in their time)."""
    labels = kube.get_node(node).labels
    return {k: v for k, v in labels.items() if k in (CONFIG, STATE, "nvidia.com/mig.capable")}


def test_plan_refuses_an_unknown_layout_and_touches_nothing(
    restored: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {s.name: mig_labels(kube, s.name) for s in restored.nodes}
    plan = tmp_path / "plan.yaml"
    plan.write_text(mig_plan("all-9g.99gb", "{selector: nvidia.com/mig.capable=true}"))
    capsys.readouterr()
    assert main(["plan", str(plan), *fleet_args(restored)]) == 2
    err = capsys.readouterr().err
    assert "layout 'all-9g.99gb' is not defined by the MIG manager's ConfigMap" in err
    assert "all-1g.5gb" in err and "all-balanced" in err
    assert f"{plan}:6:" in err
    for spec in restored.nodes:
        node = kube.get_node(spec.name)
        assert mig_labels(kube, spec.name) == before[spec.name]
        assert not node.unschedulable
        assert STEP_ANNOTATION not in node.annotations, "no step ran on it"
