"""The live seam of diagnose: one node probed through a scripted runner, facts that fail to
read named instead of fatal, and the findings they lead to; the cluster read through a fake
kube that answers with API JSON, so the pod checks judge what the transport translated."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from rollout.commands import CommandResult
from rollout.diagnose import diagnose
from rollout.diagnose.finding import Finding
from rollout.facts import ClusterFacts, FleetFacts
from rollout.facts.live import (
    gather_diagnosis_cluster,
    gather_diagnosis_facts,
    probe_node_tolerantly,
)
from rollout.lab.apiserver import Registry
from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.resources import DAEMONSETS, EVENTS, PODS, RUNTIMECLASSES
from rollout.transports.errors import Forbidden, NotFound
from rollout.transports.kube import (
    ConfigMap,
    DaemonSet,
    Event,
    Node,
    Pod,
    RuntimeClass,
    Taint,
)
from tests.emulator import emulated_kube
from tests.fakes import ScriptedRunner
from tests.unit.diagnose_facts import EXAMPLES, NOW

MAIN = (EXAMPLES / "gpu-a-2/files/etc/containerd/config.toml").read_text()
TOOLKIT = (EXAMPLES / "gpu-a-2/files/etc/containerd/conf.d/99-nvidia.toml").read_text()
FILES = f"/etc/containerd/config.toml\0{MAIN}\0/etc/containerd/conf.d/99-nvidia.toml\0{TOOLKIT}\0"


@dataclass(kw_only=True)
class LineRunner(ScriptedRunner):
    """Answers each command by the first words of its command line; anything else exits 127."""

    name: str = "gpu-a-2"
    answers: Mapping[str, tuple[int, str]]

    def answer(self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float) -> CommandResult:
        line = " ".join(argv)
        for prefix, (code, out) in self.answers.items():
            if line.startswith(prefix):
                return CommandResult(argv, code, out, "boom" if code else "", self.host)
        return CommandResult(argv, 127, "", "not found", self.host)


NODE = Node(
    name="gpu-a-2",
    uid="u",
    resource_version="1",
    labels={"nvidia.com/gpu.present": "true"},
    conditions={"Ready": "True"},
    capacity={"nvidia.com/gpu": "4"},
    allocatable={"nvidia.com/gpu": "0"},
)
BASE = {
    "containerd --version": (0, "containerd github.com/containerd/containerd 1.7.24~ds1 x\n"),
    "find /etc/containerd -type f -size": (0, FILES),
}


def test_a_stopped_containerd_is_a_finding_not_a_failed_probe() -> None:
    runner = LineRunner(
        answers={
            **BASE,
            "systemctl show containerd": (
                0,
                "MainPID=0\nActiveState=failed\nSubState=failed\nNRestarts=5\n"
                "ActiveEnterTimestamp=n/a\n",
            ),
            "containerd --config": (1, ""),
            "sh -c nvidia-smi": (0, "GPU 0: A100 (UUID: GPU-1)\nrollout-exit=0\n"),
            "sh -c journalctl -k": (
                0,
                "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n",
            ),
        }
    )
    node = probe_node_tolerantly("gpu-a-2", runner, NODE)
    assert node.service is not None and not node.service.running
    assert node.effective_config == {}
    assert any("config dump" in what for what in node.probe_errors)
    assert [x.xid for x in node.xids] == [79]
    assert node.driver_status is not None and node.driver_status.ok
    fleet = FleetFacts((node,), ClusterFacts(), "live")
    findings = diagnose(fleet, NOW).findings
    assert findings[0].check == "runtime.containerd-down"
    assert any("config dump" in e for e in findings[0].evidence)
    assert "advertising.unhealthy-devices" in {f.check for f in findings}


def test_no_nvidia_smi_and_no_log_reader_say_nothing() -> None:
    runner = LineRunner(
        answers={
            **BASE,
            "systemctl show containerd": (
                0,
                "MainPID=9\nActiveState=active\nSubState=running\nNRestarts=0\n"
                "ActiveEnterTimestamp=Mon 2026-11-30 10:00:00 UTC\n",
            ),
        }
    )
    node = probe_node_tolerantly("gpu-a-2", runner, NODE)
    assert node.xids == () and node.config_mtimes == {}
    checks = {f.check for f in diagnose(FleetFacts((node,), ClusterFacts(), "live"), NOW).findings}
    assert "operator.nvidia-smi-failed" not in checks
    assert "operator.driver-library-mismatch" not in checks


# ---------------------------------------------------------------- the cluster, live

RUNNING = {
    **BASE,
    "systemctl show containerd": (
        0,
        "MainPID=9\nActiveState=active\nSubState=running\nNRestarts=0\n"
        "ActiveEnterTimestamp=Mon 2026-11-30 10:00:00 UTC\n",
    ),
}
SCHEDULER = "0/1 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}."


def pod_json(
    name: str,
    resources: Mapping[str, Any],
    *,
    namespace: str = "ml",
    node: str | None = None,
    phase: str = "Pending",
    spec: Mapping[str, Any] | None = None,
    status: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod as the API server returns it."""
    body: dict[str, Any] = {
        "containers": [{"name": "main", "image": "cuda", "resources": dict(resources)}],
        **(spec or {}),
    }
    if node:
        body["nodeName"] = node
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": name, "resourceVersion": "1"},
        "spec": body,
        "status": {"phase": phase, **(status or {})},
    }


@dataclass
class FakeKube:
    """The reads diagnose makes, answered from API JSON through the transport's objects."""

    node: Node = NODE
    pods: Sequence[Mapping[str, Any]] = ()
    runtime_classes: Sequence[RuntimeClass] | Exception = (RuntimeClass("nvidia", "nvidia"),)
    events: Sequence[Event] = ()
    event_selectors: list[tuple[str | None, str | None]] = field(default_factory=list)

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        return [self.node]

    def list_pods(self, namespace: str | None = None, **_: str | None) -> list[Pod]:
        return [Pod.from_json(p) for p in self.pods]

    def read_pod_log(self, namespace: str, name: str, **_: Any) -> str:
        return "waiting for the driver\n"

    def list_cluster_policies(self) -> list[dict[str, Any]]:
        return [{"spec": {}}]

    def get_configmap(self, namespace: str, name: str) -> ConfigMap:
        raise NotFound("get", f"configmap {namespace}/{name}")

    def list_daemonsets(self, namespace: str | None = None) -> list[DaemonSet]:
        return []

    def list_runtime_classes(self) -> list[RuntimeClass]:
        if isinstance(self.runtime_classes, Exception):
            raise self.runtime_classes
        return list(self.runtime_classes)

    def list_events(
        self, namespace: str | None = None, field_selector: str | None = None
    ) -> list[Event]:
        self.event_selectors.append((namespace, field_selector))
        return [
            e
            for e in self.events
            if e.namespace == namespace
            and f"involvedObject.name={e.involved_name}" in str(field_selector)
        ]


def diagnose_live(kube: FakeKube) -> list[Finding]:
    runner = LineRunner(answers=RUNNING)
    fleet, unreachable = gather_diagnosis_facts({"gpu-a-2": runner}, kube)  # type: ignore[arg-type]
    assert unreachable == {}
    return list(diagnose(fleet, NOW).findings)


def only(findings: list[Finding], check: str) -> Finding:
    (found,) = [f for f in findings if f.check == check]
    return found


def test_requests_without_limits_fires_live() -> None:
    kube = FakeKube(
        pods=[
            pod_json("bad-1", {"requests": {"nvidia.com/gpu": "1", "cpu": "1"}}),
            pod_json(
                "good-1", {"limits": {"nvidia.com/gpu": "1"}}, node="gpu-a-2", phase="Running"
            ),
        ]
    )
    finding = only(diagnose_live(kube), "pods.requests-without-limits")
    assert finding.pod == "ml/bad-1"
    assert finding.evidence == ("main: requests nvidia.com/gpu=1, limits: none",)


def test_runtimeclass_missing_fires_live_for_the_cluster_and_for_a_pod() -> None:
    kube = FakeKube(
        pods=[
            pod_json(
                "legacy",
                {"limits": {"nvidia.com/gpu": "1"}},
                node="gpu-a-2",
                phase="Running",
                spec={"runtimeClassName": "nvidia-legacy"},
            )
        ],
        runtime_classes=(RuntimeClass("kata", "kata"),),
    )
    found = [f for f in diagnose_live(kube) if f.check == "pods.runtimeclass-missing"]
    assert {f.pod for f in found} == {None, "ml/legacy"}
    assert all("RuntimeClasses: kata" in f.evidence for f in found)


@pytest.mark.parametrize("refusal", [Forbidden("list", "runtimeclasses"), NotFound("list", "x")])
def test_runtime_classes_the_api_will_not_list_are_not_judged(refusal: Exception) -> None:
    kube = FakeKube(
        pods=[pod_json("p", {}, node="gpu-a-2", spec={"runtimeClassName": "gone"})],
        runtime_classes=refusal,
    )
    assert "pods.runtimeclass-missing" not in {f.check for f in diagnose_live(kube)}


def test_a_taint_no_pod_tolerates_is_no_gpu_node_fits_with_the_pod_events() -> None:
    kube = FakeKube(
        node=replace(NODE, taints=(Taint("nvidia.com/gpu", "NoSchedule", "present"),)),
        pods=[
            pod_json(
                "train",
                {"limits": {"nvidia.com/gpu": "1"}},
                status={
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": SCHEDULER,
                        }
                    ]
                },
            ),
            pod_json("cpu-only", {}),
        ],
        events=(
            Event("ml", "e1", "Pod", "train", "FailedScheduling", SCHEDULER, "Warning", 3),
            Event("ml", "e2", "Pod", "other", "FailedScheduling", "not ours", "Warning"),
        ),
    )
    finding = only(diagnose_live(kube), "pods.no-gpu-node-fits")
    assert finding.pod == "ml/train"
    assert finding.evidence[:2] == (
        f"scheduler: {SCHEDULER}",
        f"event: Warning FailedScheduling: {SCHEDULER} (x3)",
    )
    assert "excluded: taint nvidia.com/gpu=present:NoSchedule not tolerated" in finding.evidence[2]
    # events are read for the GPU pods waiting for a node, and the controllers' refusals
    assert kube.event_selectors == [
        ("ml", "involvedObject.kind=Pod,involvedObject.name=train"),
        (None, "reason=FailedCreate"),
    ]


def test_a_pod_tolerating_the_taint_is_pending_not_excluded() -> None:
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    kube = FakeKube(
        node=replace(NODE, taints=(Taint("nvidia.com/gpu", "NoSchedule", "present"),)),
        pods=[
            pod_json(
                "train", {"limits": {"nvidia.com/gpu": "1"}}, spec={"tolerations": [toleration]}
            )
        ],
    )
    checks = {f.check for f in diagnose_live(kube)}
    assert "pods.pending" in checks and "pods.no-gpu-node-fits" not in checks


def test_an_operand_stuck_in_an_init_container_names_it() -> None:
    driver = pod_json(
        "nvidia-driver-daemonset-x7",
        {},
        namespace="gpu-operator",
        node="gpu-a-2",
        status={
            "initContainerStatuses": [
                {
                    "name": "k8s-driver-manager",
                    "ready": False,
                    "restartCount": 6,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                },
                {"name": "nvidia-driver-init", "state": {"waiting": {"reason": "PodInitializing"}}},
            ]
        },
    )
    finding = only(diagnose_live(FakeKube(pods=[driver])), "operator.operand-failing")
    assert finding.evidence[:2] == (
        "gpu-operator/nvidia-driver-daemonset-x7: Pending, not ready, Init:CrashLoopBackOff",
        "init container k8s-driver-manager: waiting (CrashLoopBackOff), 6 restart(s)",
    )
    assert "log: waiting for the driver" in finding.evidence
    assert finding.command.endswith("-c k8s-driver-manager --tail 20")


def record_event(
    registry: Registry, about: tuple[str, str], reason: str, message: str, count: int
) -> None:
    """A Warning event in namespace ml about (kind, name), as a controller records one."""
    kind, name = about
    registry.create(
        EVENTS,
        "ml",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.1", "namespace": "ml"},
            "involvedObject": {"kind": kind, "name": name, "namespace": "ml"},
            "reason": reason,
            "message": ("Error creating: " if reason == "FailedCreate" else "") + message,
            "type": "Warning",
            "count": count,
        },
    )


def test_the_pod_checks_read_through_the_official_client() -> None:
    """The same reads against the API emulator in-process: what the server sends is judged."""
    registry = Registry()
    registry.ensure_namespace("ml")
    klass = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "legacy"}
    registry.create(RUNTIMECLASSES, None, {**klass, "metadata": {"name": "legacy"}})
    spec = {"runtimeClassName": "legacy"}
    registry.create(PODS, "ml", pod_json("legacy", {"limits": {"nvidia.com/gpu": "1"}}, spec=spec))
    registry.delete(RUNTIMECLASSES, None, "legacy")  # gone under a pod that names it
    # A GPU request without a limit never becomes a pod: the API refuses it, and the
    # ReplicaSet controller records what the API said.
    refused = pod_json("train-7d9f-x2x", {"requests": {"nvidia.com/gpu": "1"}})
    with pytest.raises(ApiError) as refusal:
        registry.create(PODS, "ml", refused)
    record_event(registry, ("ReplicaSet", "train-7d9f"), "FailedCreate", refusal.value.message, 3)
    registry.create(PODS, "ml", pod_json("bad-1", {"limits": {"nvidia.com/gpu": "1"}}))
    record_event(registry, ("Pod", "bad-1"), "FailedScheduling", SCHEDULER, 2)
    registry.ensure_namespace("gpu-operator")
    template = {
        "metadata": {"labels": {"app": "plugin"}},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "containers": [{"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}],
        },
    }
    registry.create(
        DAEMONSETS,
        "gpu-operator",
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "gpu-operator"},
            "spec": {"selector": {"matchLabels": {"app": "plugin"}}, "template": template},
        },
    )
    with emulated_kube(registry) as kube:
        cluster = gather_diagnosis_cluster(kube, kube.list_pods(None))
    (daemonset,) = cluster.daemonsets or ()
    assert daemonset.node_selector == {"nvidia.com/gpu.deploy.device-plugin": "true"}
    assert daemonset.tolerations[0].tolerates("nvidia.com/gpu", "", "NoSchedule")
    assert cluster.runtime_classes == {}
    assert cluster.pod_events == {"ml/bad-1": (f"Warning FailedScheduling: {SCHEDULER} (x2)",)}
    (lines,) = cluster.failed_creates.values()
    assert "Limit must be set for non overcommitable resources (x3)" in lines[0]
    found = {(f.check, f.pod) for f in diagnose(FleetFacts((), cluster, "live"), NOW).findings}
    assert {
        ("pods.requests-without-limits", None),
        ("pods.runtimeclass-missing", "ml/legacy"),
        ("pods.runtimeclass-missing", None),
    } <= found
