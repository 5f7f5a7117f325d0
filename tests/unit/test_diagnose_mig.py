"""diagnose and the MIG manager, live: what rollout.facts.migmanager reads through a real
KubeClient on the API emulator (the manager's ConfigMap and its pod's log, a Ready pod the
operand logs skip), the findings it leads to in every output, and what `--fix` says of them.
The checks themselves, case by case, are data/diagnose/cases.yaml's."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rollout.diagnose import diagnose, plan_remedies
from rollout.facts import FleetFacts, load_recorded_facts
from rollout.facts.migmanager import with_mig_manager
from rollout.lab.apiserver import Registry
from rollout.lab.apiserver.patches import PatchType
from rollout.lab.apiserver.resources import CONFIGMAPS, PODS
from rollout.transports.kube import KubeClient
from tests.emulator import emulated_kube
from tests.unit.diagnose_facts import EXAMPLES, NOW

MANAGER = "nvidia-mig-manager-q8z"
LOG = (
    "Updating to MIG config: all-1g.5gb\n"
    "Applying the selected MIG config to the node\n"
    "Error: unable to create MIG devices: Insufficient Resources\n"
    "Unable to apply MIG config\n"
)
CONFIG = (
    "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n"
)


def manager_pod(node: str) -> dict[str, Any]:
    """The MIG manager's pod as the API holds it: Running and Ready while it reports failed."""
    return {
        "metadata": {
            "namespace": "gpu-operator",
            "name": MANAGER,
            "labels": {"app": "nvidia-mig-manager"},
        },
        "spec": {"nodeName": node, "containers": [{"name": "nvidia-mig-manager", "image": "m"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": "nvidia-mig-manager", "ready": True, "state": {"running": {}}}
            ],
        },
    }


def create_pod(registry: Registry, pod: dict[str, Any]) -> None:
    """The pod created, then its status written as the kubelet writes it (create drops it)."""
    registry.create(PODS, "gpu-operator", pod)
    status = pod["status"]
    registry.patch(
        PODS, "gpu-operator", MANAGER, PatchType.MERGE, {"status": status}, subresource="status"
    )


def cluster_with_manager() -> Registry:
    registry = Registry()
    registry.ensure_namespace("gpu-operator")
    create_pod(registry, manager_pod("gpu-a-1"))
    registry.write_log("gpu-operator", MANAGER, "nvidia-mig-manager", LOG)
    registry.create(
        CONFIGMAPS,
        "gpu-operator",
        {"metadata": {"name": "default-mig-parted-config"}, "data": {"config.yaml": CONFIG}},
    )
    return registry


def fleet_asking(kube: KubeClient, labels: dict[str, str]) -> FleetFacts:
    """The example fleet, gpu-a-1 labelled with `labels` and bound to the API's pods."""
    fleet = load_recorded_facts(EXAMPLES)
    nodes = tuple(
        dataclasses.replace(
            n,
            labels={**n.labels, **labels},
            pods=tuple(p for p in kube.list_pods(None) if p.node_name == n.name),
            capacity={"nvidia.com/gpu": "4"},
            allocatable={"nvidia.com/gpu": "4"},
        )
        if n.name == "gpu-a-1"
        else n
        for n in fleet.nodes
    )
    return dataclasses.replace(fleet, nodes=nodes)


FAILED = {"nvidia.com/mig.config": "all-1g.5gb", "nvidia.com/mig.config.state": "failed"}


def test_a_failed_layout_is_read_with_the_managers_log_and_configmap() -> None:
    with emulated_kube(cluster_with_manager()) as kube:
        fleet = with_mig_manager(kube, fleet_asking(kube, FAILED))
    node = fleet.by_name("gpu-a-1")
    assert node is not None
    assert node.pod_logs[f"gpu-operator/{MANAGER}"] == LOG
    configmap = fleet.cluster.configmaps["gpu-operator/default-mig-parted-config"]
    assert configmap == {"config.yaml": CONFIG}
    diagnosis = diagnose(fleet, NOW, ["gpu-a-1"])
    checks = [f.check for f in diagnosis.findings]
    assert checks[:2] == ["operator.mig-config-missing-layout", "operator.mig-config-failed"]
    failed = diagnosis.findings[1]
    assert failed.evidence[-2:] == (
        "log: Error: unable to create MIG devices: Insufficient Resources",
        "log: Unable to apply MIG config",
    )
    assert failed.command.startswith(f"kubectl logs -n gpu-operator {MANAGER} --tail 50; ")
    finding = json.loads(json.dumps(diagnosis.to_json()))["findings"][1]
    assert finding["check"] == "operator.mig-config-failed"
    assert finding["branch"] == "operator" and finding["severity"] == "error"
    assert "failed to apply layout 'all-1g.5gb' on gpu-a-1" in finding["cause"]


def test_a_fleet_asking_no_layout_reads_nothing_more() -> None:
    with emulated_kube(cluster_with_manager()) as kube:
        fleet = fleet_asking(kube, {})
        assert with_mig_manager(kube, fleet) is fleet


def test_a_manager_whose_log_and_configmap_cannot_be_read_leaves_them_out() -> None:
    registry = Registry()
    registry.ensure_namespace("gpu-operator")
    registry.create(PODS, "gpu-operator", manager_pod("gpu-a-1"))  # no status: not started
    with emulated_kube(registry) as kube:
        fleet = with_mig_manager(kube, fleet_asking(kube, FAILED))
    node = fleet.by_name("gpu-a-1")
    assert node is not None and node.pod_logs == {}
    assert "gpu-operator/default-mig-parted-config" not in fleet.cluster.configmaps
    findings = diagnose(fleet, NOW, ["gpu-a-1"]).findings
    (failed,) = [f for f in findings if f.check.startswith("operator.mig")]
    assert failed.check == "operator.mig-config-failed"
    assert failed.evidence[-2:] == (
        f"MIG manager pod gpu-operator/{MANAGER}: Pending",
        "log: not read",
    )


def test_fix_leaves_a_failed_layout_to_a_person_and_says_what_to_do() -> None:
    with emulated_kube(cluster_with_manager()) as kube:
        fleet = with_mig_manager(kube, fleet_asking(kube, FAILED))
    remedies = plan_remedies(diagnose(fleet, NOW, ["gpu-a-1"]), fleet)
    assert remedies.plan is None
    reasons = {f.check: why for f, why in remedies.manual}
    assert reasons["operator.mig-config-failed"].startswith("read the MIG manager's log, then")
    assert "add the layout to its mig-configs" in reasons["operator.mig-config-missing-layout"]
