"""mode: operator end to end on a 5-node lab of the module's own: rollout pins every node the
driver DaemonSet serves, changes the ClusterPolicy's version, releases the 4 targets wave by
wave through the lab's upgrade controller, halts on upgrade-failed, and converges on resume;
then the node left pinned fails its own upgrade, and `diagnose --fix` retries it.
What each node's nvidia-smi reports comes from the driver state its driver pod installed.
The tests run in file order on one lab: the second starts where the first leaves it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rollout.cli import main
from rollout.lab.cluster import CONTEXT, Lab
from rollout.lab.image import INSTALLED_DRIVER
from rollout.run import list_runs, read_run
from rollout.transports.kube import KubeClient
from tests.lab.labapi import apply_args, fleet_args, wait_for
from tests.lab.test_cluster_shared import own_lab, ssh_check

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

TARGET = "550.90.07"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
STATE = "nvidia.com/gpu-driver-upgrade-state"
FAIL_KNOB = "lab.rollout/fail-upgrade"
GPU = "nvidia.com/gpu"
TARGETS = ("lab-node-1", "lab-node-2", "lab-node-3", "lab-node-4")
PINNED = "lab-node-5"
PLAN = f"""\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: operator-driver}}
targets: {{nodes: [{", ".join(TARGETS)}]}}
changes:
  - driver-upgrade: {{version: "{TARGET}", mode: operator, upgrade_timeout_s: 120}}
policy:
  waves: [1]
  max_unavailable: 1
  on_failure: rollback
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("driver-operator") / "lab", ("1.7",) * 5, gpus=1) as built:
        yield built


def smi_version(lab: Lab, name: str) -> str:
    node = next(n for n in lab.nodes if n.name == name)
    out = ssh_check(
        lab, node, ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    )
    return out.strip().splitlines()[0]


def test_operator_waves_halt_on_upgrade_failed_and_resume_converges(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    state = tmp_path / "state"
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as kube:
        # the plan names the version change, the policy in force and who stays pinned
        capsys.readouterr()
        assert main(["plan", str(plan), *fleet_args(lab), "--output", "json"]) == 0
        data = json.loads(capsys.readouterr().out)
        kinds = [c["kind"] for c in data["cluster_changes"]]
        assert kinds == ["driver.pin", "driver.version", "driver.upgradePolicy"]
        assert any(w.startswith(f"NOT UPGRADED: {PINNED}") for w in data["warnings"])

        # node 3's driver container will fail to install: the operator marks it upgrade-failed
        kube.patch_node_annotations("lab-node-3", {FAIL_KNOB: "true"})
        assert main(apply_args(lab, plan, state)) == 1
        out = capsys.readouterr().out
        assert f"NOT UPGRADED: {PINNED}" in out and f"kubectl label node {PINNED} {SKIP}-" in out
        assert f'"version":"{INSTALLED_DRIVER}"' in out  # the way back, after the halt
        (run,) = list_runs(state)
        assert run.halted_reason
        nodes = {n: kube.get_node(n) for n in (*TARGETS, PINNED)}
        assert nodes["lab-node-3"].labels.get(STATE) == "upgrade-failed"
        # no further skip label removed: node 4 and the non-target stay pinned
        assert nodes["lab-node-4"].labels.get(SKIP) == "true"
        assert nodes[PINNED].labels.get(SKIP) == "true"
        for name in ("lab-node-1", "lab-node-2"):
            assert SKIP not in nodes[name].labels
            assert nodes[name].labels.get(STATE) == "upgrade-done"
            assert smi_version(lab, name) == TARGET
        assert smi_version(lab, "lab-node-4") == INSTALLED_DRIVER
        record = read_run(state, run.run_id)
        assert record.node("lab-node-4").outcome is None

        # fixed: the next driver container installs, upgrade-failed clears itself once the
        # pod is in sync and Ready (its restart back-off first); then the operator resumes
        kube.patch_node_annotations("lab-node-3", {FAIL_KNOB: None})
        wait_for(
            lambda: kube.get_node("lab-node-3").labels.get(STATE) != "upgrade-failed",
            120.0,
            what="lab-node-3's upgrade-failed to clear itself",
        )
        resumed = main(["resume", run.run_id, "--state-dir", str(state), "--output", "json"])
        report = json.loads(capsys.readouterr().out)
        assert resumed == 1  # node 3 failed in this run, even though it converged since
        for name in TARGETS:
            node = kube.get_node(name)
            assert node.labels.get(STATE) == "upgrade-done", name
            assert SKIP not in node.labels and not node.unschedulable, name
            assert smi_version(lab, name) == TARGET, name
        record = read_run(state, run.run_id)
        assert record.node("lab-node-4").outcome is not None
        assert record.node("lab-node-4").outcome.value == "succeeded"
        # the non-target stays on the old driver, pinned, and the summary says so
        assert kube.get_node(PINNED).labels.get(SKIP) == "true"
        assert smi_version(lab, PINNED) == INSTALLED_DRIVER
        assert report["nodes"]["lab-node-4"]["outcome"] == "succeeded"
        assert any(n.startswith(f"NOT UPGRADED: {PINNED}") for n in report["notes"])


def test_diagnose_fix_retries_an_upgrade_the_operator_failed(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """lab-node-5, left pinned on the old driver by the test above, runs a GPU pod no
    controller owns: the operator's pod deletion refuses it (podDeletion.force is off), so the
    node goes upgrade-failed before its driver pod restarts, and the label does not clear
    itself (the pod is not in sync). diagnose names it; once the pod is gone, --fix's plan
    relabels the node upgrade-required, the operator finishes, and diagnose is healthy."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace(", ".join(TARGETS), PINNED))
    notebook = {
        "metadata": {"name": "notebook"},
        "spec": {
            "nodeName": PINNED,
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {GPU: "1"}}}],
        },
    }
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as kube:
        kube.create_pod("default", notebook)
        assert main(apply_args(lab, plan, tmp_path / "state")) == 1
        assert kube.get_node(PINNED).labels.get(STATE) == "upgrade-failed"

        capsys.readouterr()
        fix = tmp_path / "fix.yaml"
        code = main(["diagnose", PINNED, *fleet_args(lab), "--fix", str(fix), "-o", "json"])
        findings = json.loads(capsys.readouterr().out)["findings"]
        assert code == 1
        errors = [f for f in findings if f["severity"] == "error"]
        assert errors[0]["check"] == "operator.upgrade-failed", errors
        document = yaml.safe_load(fix.read_text())
        assert document["targets"] == {"nodes": [PINNED]}
        assert document["changes"] == [
            {"driver-upgrade": {"version": TARGET, "mode": "operator", "retry_failed": True}}
        ]

        # the person fixes the cause; the label stays, the driver pod being out of sync
        kube.delete_pod("default", "notebook")
        wait_for(
            lambda: all(p.name != "notebook" for p in kube.list_pods("default")),
            60.0,
            what="the notebook pod to go",
        )
        assert kube.get_node(PINNED).labels.get(STATE) == "upgrade-failed"

        assert main(["plan", str(fix), *fleet_args(lab)]) == 0
        assert "upgrade-failed -> upgrade-required" in capsys.readouterr().out
        assert main(apply_args(lab, fix, tmp_path / "fix-state")) == 0
        # the smoke pod's nvidia-smi ran on the node and saw the new driver
        (smoke,) = [
            line for line in capsys.readouterr().err.splitlines() if "gpu.smoke done" in line
        ]
        assert smoke.endswith(f"; driver {TARGET}"), smoke
        node = kube.get_node(PINNED)
        assert node.labels.get(STATE) == "upgrade-done" and not node.unschedulable
        assert smi_version(lab, PINNED) == TARGET
        assert main(["diagnose", PINNED, *fleet_args(lab)]) == 0
