"""mode: operator with `nvidiadriver: NAME` on a 4-node lab of the module's own whose drivers
are two NVIDIADriver resources (pool-a: nodes 1-3, pool-b: node 4; `rollout lab
driver-pools`): the plan, from live and from recorded facts alike, changes pool-a's
spec.version only, pins pool-a's nodes and reports pool-b's node; apply upgrades the two
targets wave by wave through the lab's upgrade controller and each smoke pod sees the new
driver; pool-a's third node stays pinned and pool-b's node stays on the old driver, and the
run summary says both."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.lab.cluster import CONTEXT, Lab
from rollout.lab.driverpools import split_driver_pools
from rollout.lab.image import INSTALLED_DRIVER
from rollout.lab.scenarios import LabAccess
from rollout.transports.kube import KubeClient
from tests.lab.labapi import apply_args, fleet_args
from tests.lab.test_cluster_shared import own_lab
from tests.lab.test_driver_operator import smi_version

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

TARGET = "550.90.07"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
STATE = "nvidia.com/gpu-driver-upgrade-state"
POOLS = {"pool-a": ("lab-node-1", "lab-node-2", "lab-node-3"), "pool-b": ("lab-node-4",)}
TARGETS = ("lab-node-1", "lab-node-2")
PINNED = "lab-node-3"
OTHER = "lab-node-4"
PLAN = f"""\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: pool-a-driver}}
targets: {{nodes: [{", ".join(TARGETS)}]}}
changes:
  - driver-upgrade: {{version: "{TARGET}", mode: operator, nvidiadriver: pool-a,
                      upgrade_timeout_s: 120}}
policy:
  waves: [1]
  max_unavailable: 1
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("nvidiadriver") / "lab", ("1.7",) * 4, gpus=1) as built:
        with KubeClient.from_kubeconfig(str(built.kubeconfig), context=CONTEXT) as kube:
            split_driver_pools(LabAccess(built, kube), POOLS)
        yield built


def test_one_nvidiadriver_is_upgraded_wave_by_wave_and_the_other_pool_stays(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    capsys.readouterr()
    assert main(["plan", str(plan), *fleet_args(lab), "--output", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    pin, version, policy = data["cluster_changes"]
    assert version["target"] == "NVIDIADriver pool-a spec.version"
    assert version["action"] == f"{INSTALLED_DRIVER} -> {TARGET}"
    assert pin["target"] == "3 node(s) the driver DaemonSet of NVIDIADriver pool-a serves"
    assert "autoUpgrade true" in policy["noop_reason"]
    assert any(w.startswith(f"NOT UPGRADED: {PINNED}") for w in data["warnings"])
    assert any(
        w.startswith(f"NOT UPGRADED: {OTHER} is served by NVIDIADriver pool-b")
        for w in data["warnings"]
    )

    # recorded facts plan the same change
    facts = tmp_path / "facts"
    assert main(["facts", "record", str(facts), "--plan", str(plan), *fleet_args(lab)]) == 0
    capsys.readouterr()
    assert main(["plan", str(plan), "--facts", str(facts), "--output", "json"]) == 0
    recorded = json.loads(capsys.readouterr().out)
    assert recorded["cluster_changes"] == data["cluster_changes"]
    assert recorded["warnings"] == data["warnings"]

    assert main([*apply_args(lab, plan, tmp_path / "state"), "--output", "json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    # one wave per target: each released and watched to upgrade-done before the next
    assert [[n["name"] for n in w["nodes"]] for w in data["waves"]] == [[t] for t in TARGETS]
    smokes = [line for line in captured.err.splitlines() if "gpu.smoke done" in line]
    assert len(smokes) == 2 and all(s.endswith(f"; driver {TARGET}") for s in smokes), smokes
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as kube:
        for name in TARGETS:
            node = kube.get_node(name)
            assert node.labels.get(STATE) == "upgrade-done" and SKIP not in node.labels, name
            assert not node.unschedulable, name
            assert smi_version(lab, name) == TARGET, name
        # pool-a's non-target stays pinned; pool-b's node was never touched
        assert kube.get_node(PINNED).labels.get(SKIP) == "true"
        assert smi_version(lab, PINNED) == INSTALLED_DRIVER
        other = kube.get_node(OTHER)
        assert SKIP not in other.labels and other.labels.get(STATE) == "upgrade-done"
        assert smi_version(lab, OTHER) == INSTALLED_DRIVER
    notes = report["notes"]
    assert any(n.startswith(f"NOT UPGRADED: {PINNED}") for n in notes), notes
    assert any(
        n.startswith(f"NOT UPGRADED: {OTHER} is served by NVIDIADriver pool-b") for n in notes
    )
