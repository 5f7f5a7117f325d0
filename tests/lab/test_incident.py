"""The seed incident of DESIGN.md, end to end in a lab of its own (containerd 1.6 and 1.7).

A naive registry drop-in is written on both nodes: nothing changes, nothing reads it yet.
A ClusterPolicy change that touches the toolkit (its version, as an operator upgrade does)
with a time-slicing change makes the operator roll its operands: each node's toolkit
re-runs (a time-slicing change alone would not: the toolkit's DaemonSet does not render
spec.devicePlugin), copies the effective config -- in which the drop-in
has replaced the whole CRI plugin table -- and restarts containerd, and the `nvidia` handler
is gone from the running config. The device plugin, still running, notices nothing until its
pod next starts: when the operator, once the toolkit has rolled out, rolls the plugin for
its new config. Then its sandbox is refused, allocatable drops to 0, the resource leaves the
node after the grace period, and a GPU pod is Pending with `Insufficient nvidia.com/gpu`.
rollout diagnoses it (`runtime.shadowing` on both nodes), and its repair plan, applied,
should restore both nodes (the smoke pod runs) and the repaired 1.7 node keep the repair
and the handlers through a reboot, its toolkit re-running. The repair's gpu.wait expects the
profile the node's plugin loads once it can start again (GFD's replicas label then), not the
one it last ran. Everything through the official Kubernetes client and the nodes' real
containerd.
"""

from __future__ import annotations

import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.lab.nodes import RUNNING_RECORD, NodeSpec
from rollout.lab.simulation.probe import handlers_in_dump
from tests.lab.labapi import Waiting, apply_args, diagnose_report, patch_cluster_policy
from tests.lab.test_cluster_shared import own_lab, ssh_check, ssh_run
from tests.planning import sharing_config

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

SERIES = ("1.6", "1.7")
GRACE_S = 10
REGISTRY_DROP_IN = "/etc/containerd/conf.d/registry.toml"
NAIVE_REGISTRY = (
    '[plugins."io.containerd.grpc.v1.cri".registry]\nconfig_path = "/etc/containerd/certs.d"\n'
)
GPU = "nvidia.com/gpu"
FIX_PLAN = "incident-fix.yaml"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
# The simulated cluster and the nodes react in seconds.
settle = Waiting(timeout_s=90.0, interval_s=0.5)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab_dir = tmp_path_factory.mktemp("incident") / "lab"
    with own_lab(lab_dir, SERIES, 1, device_plugin_grace_s=GRACE_S) as built:
        yield built


@pytest.fixture(scope="module")
def core(lab: Lab) -> Any:
    from kubernetes import client, config

    api = config.new_client_from_config(str(lab.kubeconfig), context="rollout-lab")
    return client.CoreV1Api(api)


def gpus(core: Any, node: str) -> tuple[str | None, str | None]:
    status = core.read_node(node).status
    return (status.capacity or {}).get(GPU), (status.allocatable or {}).get(GPU)


def record_has_nvidia(lab: Lab, node: NodeSpec) -> bool | None:
    """Whether the running containerd has the nvidia handler (None: it is not running)."""
    try:
        dump = tomllib.loads(lab.node_dirs(node).host_path(RUNNING_RECORD).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return "nvidia" in handlers_in_dump(dump)


def rerun_lost_handler(lab: Lab, node: NodeSpec) -> bool:
    """The toolkit wrote its drop-in, containerd restarted after that, without `nvidia`."""
    dirs = lab.node_dirs(node)
    drop_in = dirs.host_path("/etc/containerd/conf.d/99-nvidia.toml")
    record = dirs.host_path(RUNNING_RECORD)
    try:
        fresh = record.stat().st_mtime_ns > drop_in.stat().st_mtime_ns
    except OSError:
        return False
    return fresh and record_has_nvidia(lab, node) is False


def plugin_pod(core: Any, node: str) -> Any:
    pods = core.list_namespaced_pod(
        "gpu-operator", label_selector=f"app={PLUGIN_APP}", field_selector=f"spec.nodeName={node}"
    ).items
    return next((p for p in pods if p.metadata.deletion_timestamp is None), None)


def sandbox_refused(core: Any, node: str) -> bool:
    pod = plugin_pod(core, node)
    if pod is None:
        return False
    events = core.list_namespaced_event(
        "gpu-operator",
        field_selector=f"involvedObject.name={pod.metadata.name},reason=FailedCreatePodSandBox",
    ).items
    return any('no runtime for "nvidia" is configured' in e.message for e in events)


def gpu_pod_pending_message(core: Any, node: str) -> str:
    from kubernetes import client

    name = f"gpu-probe-{uuid.uuid4().hex[:6]}"
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="default"),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node},
            restart_policy="Never",
            containers=[
                client.V1Container(
                    name="cuda",
                    image="nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04",
                    command=["nvidia-smi", "-L"],
                    resources=client.V1ResourceRequirements(limits={GPU: "1"}),
                )
            ],
        ),
    )
    core.create_namespaced_pod("default", pod)
    try:

        def unschedulable() -> str | None:
            status = core.read_namespaced_pod(name, "default").status
            for condition in status.conditions or []:
                if condition.type == "PodScheduled" and condition.status == "False":
                    return str(condition.message or "")
            return None

        message = settle(f"a GPU pod on {node} to be unschedulable", unschedulable)
        assert core.read_namespaced_pod(name, "default").status.phase == "Pending"
        return message
    finally:
        core.delete_namespaced_pod(name, "default")


def effective(lab: Lab, node: NodeSpec) -> tuple[str, set[str]]:
    """(registry config_path, runtime handlers) of `containerd config dump` on the node."""
    dump = tomllib.loads(ssh_check(lab, node, ["containerd", "config", "dump"]))
    cri = dump["plugins"]["io.containerd.grpc.v1.cri"]
    return str((cri.get("registry") or {}).get("config_path", "")), handlers_in_dump(dump)


@pytest.mark.lab
def test_the_seed_incident(lab: Lab, core: Any, capsys: pytest.CaptureFixture[str]) -> None:
    for node in lab.nodes:
        settle(f"{node.name} advertising its GPU", lambda n=node: gpus(core, n.name) == ("1", "1"))

    # A naive registry drop-in on both nodes: nothing reads it yet.
    for node in lab.nodes:
        ssh_check(lab, node, ["tee", REGISTRY_DROP_IN], stdin=NAIVE_REGISTRY.encode())
        assert record_has_nvidia(lab, node) is True
        assert gpus(core, node.name) == ("1", "1")

    # A toolkit update with a time-slicing change: the operator rolls the toolkit, which
    # re-runs on every node, then the device plugin.
    core.create_namespaced_config_map(
        "gpu-operator",
        {"metadata": {"name": "time-slicing"}, "data": {"shared-2x": sharing_config(2)}},
    )
    config = {"name": "time-slicing", "default": ""}
    toolkit = {"version": "v1.17.0-ubuntu20.04"}
    patch_cluster_policy(core.api_client, {"toolkit": toolkit, "devicePlugin": {"config": config}})
    for node in lab.nodes:
        settle(
            f"{node.name}: the toolkit re-run, and containerd without the nvidia handler",
            lambda n=node: rerun_lost_handler(lab, n),
        )
        drop_in = ssh_check(lab, node, ["cat", "/etc/containerd/conf.d/99-nvidia.toml"])
        assert "nvidia-container-runtime" in drop_in, "the toolkit wrote its handlers"

    # The operator then rolls the device plugin: each new pod's sandbox is refused.
    for node in lab.nodes:
        settle(
            f"{node.name}: the plugin's sandbox refused",
            lambda n=node: sandbox_refused(core, n.name),
        )
    settle(
        "allocatable 0 on both nodes", lambda: all(gpus(core, n.name)[1] == "0" for n in lab.nodes)
    )
    assert all(gpus(core, n.name)[0] not in (None, "0") for n in lab.nodes), "capacity is kept"
    settle(
        f"{GPU} removed after the grace",
        lambda: all(gpus(core, n.name) == (None, None) for n in lab.nodes),
    )
    for node in lab.nodes:
        assert f"Insufficient {GPU}" in gpu_pod_pending_message(core, node.name)

    # rollout diagnoses the shadowing drop-in on both nodes.
    code, report = diagnose_report(lab, capsys, "--fix", str(lab.lab_dir / FIX_PLAN))
    assert code == 1
    blamed = {(f["check"], f["node"]) for f in report["findings"] if f["severity"] == "error"}
    assert {("runtime.shadowing", n.name) for n in lab.nodes} <= blamed, report["findings"]


@pytest.mark.lab
def test_the_repair_plan_restores_the_nodes_and_survives_a_reboot(
    lab: Lab, core: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plan = lab.lab_dir / FIX_PLAN
    if not plan.is_file():
        pytest.fail("the incident test did not write the fix plan", pytrace=False)
    # Fail in seconds rather than rollout's default five minutes of gpu.wait.
    text = plan.read_text()
    assert "\npolicy:\n" in text
    plan.write_text(text.replace("\npolicy:\n", "\npolicy:\n  verify: {gpu_wait_timeout_s: 5}\n"))
    one_seven = next(n for n in lab.nodes if n.containerd == "1.7")
    applied = main(apply_args(lab, plan, tmp_path / "state"))
    output = capsys.readouterr()
    assert applied == 0, output.out[-6000:] + output.err[-3000:]
    for node in lab.nodes:
        assert record_has_nvidia(lab, node) is True
        settle(f"{node.name} advertising again", lambda n=node: gpus(core, n.name) == ("2", "2"))
    repaired = effective(lab, one_seven)
    assert repaired[0] and "nvidia" in repaired[1]

    # A reboot: the toolkit stops with the node (its drop-in deleted) and re-runs after it.
    boot = ssh_check(lab, one_seven, ["cat", "/proc/sys/kernel/random/boot_id"])
    ssh_run(lab, one_seven, ["systemctl", "reboot"])
    settle(
        "the 1.7 node to boot again",
        lambda: (
            ssh_run(lab, one_seven, ["cat", "/proc/sys/kernel/random/boot_id"]).stdout
            not in ("", boot)
        ),
    )
    settle("the 1.7 node's toolkit to re-run", lambda: record_has_nvidia(lab, one_seven) is True)
    assert effective(lab, one_seven) == repaired
    settle("1.7 advertising after the reboot", lambda: gpus(core, one_seven.name) == ("2", "2"))
