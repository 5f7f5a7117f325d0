"""The lab's MIG manager and MIG-capable stand-in GPUs, driven as a user drives the GPU
Operator's: real kubectl labels a node with a layout and waits for its state, then the node's
own `nvidia-smi -L` (over SSH), its advertised resources under both strategies and a pod given
one MIG device through the node's real containerd say what the layout made.

The manager runs as the operator runs it: real kubectl lists its `nvidia-mig-manager` pod on
the node and `kubectl logs` reads what it did (the real manager's words).

One lab of its own (one node, two GPUs): the scenarios `mig-manager-failed` and
`mig-mode-needs-reboot` are broken and healed here, the latter rebooting the node for real.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.lab.registryimages import SMOKE_IMAGE
from rollout.steps.gpu_smoke import SMOKE_CONTAINER, smoke_pod_manifest
from rollout.transports.kube import KubeClient
from tests.lab.test_cluster_shared import own_lab, ssh_check, ssh_run
from tests.lab.test_schedule import lab_kubectl

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

STATE = "nvidia.com/mig.config.state"
LAYOUT_PATH = "/var/lib/rollout-lab/mig-layout.json"
WAIT_S = 120
MIG_LINE = re.compile(r"^  MIG (\S+) +Device +\d+: \(UUID: (MIG-[0-9a-f-]+)\)$")
GPU_LINE = re.compile(r"^GPU \d+: NVIDIA A100-SXM4-40GB \(UUID: (GPU-[0-9a-f-]+)\)$")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("mig") / "lab", ("1.7",), gpus=2) as built:
        yield built


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kubectl-home")


def kubectl(lab: Lab, home: Path, *args: str) -> str:
    return lab_kubectl(lab, home, *args)


def configure(lab: Lab, kube: KubeClient, home: Path, layout: str, state: str = "success") -> None:
    """Label the node with `layout` and wait, with kubectl, for the MIG manager's `state`."""
    node = f"node/{lab.nodes[0].name}"
    kubectl(lab, home, "label", node, f"nvidia.com/mig.config={layout}", "--overwrite")
    # the state may still be the last layout's `success`: wait for the manager to take the
    # label up (it leaves `success`), or for the node to have that layout already
    settle(
        f"the MIG manager to take up {layout}",
        lambda: mig_state(kube, lab) != "success" or applied_config(lab) == layout,
    )
    jsonpath = "jsonpath={.metadata.labels.nvidia\\.com/mig\\.config\\.state}=" + state
    kubectl(lab, home, "wait", f"--for={jsonpath}", node, f"--timeout={WAIT_S}s")


def mig_state(kube: KubeClient, lab: Lab) -> str:
    return str(kube.get_node(lab.nodes[0].name).labels.get(STATE, ""))


def applied_config(lab: Lab) -> str:
    """The layout the node's own layout file says is applied (none: all-disabled)."""
    text = ssh_run(lab, lab.nodes[0], ["cat", LAYOUT_PATH]).stdout
    return str(json.loads(text)["config"]) if text.strip() else "all-disabled"


def set_strategy(lab: Lab, home: Path, strategy: str) -> None:
    patch = json.dumps({"spec": {"mig": {"strategy": strategy}}})
    kubectl(lab, home, "patch", "clusterpolicy", "cluster-policy", "--type=merge", "-p", patch)


def node_listing(lab: Lab) -> tuple[list[str], list[tuple[str, str]]]:
    """The GPUs' UUIDs and the MIG devices (profile, UUID) the node's nvidia-smi -L lists."""
    lines = ssh_check(lab, lab.nodes[0], ["nvidia-smi", "-L"]).splitlines()
    gpus = [m.group(1) for m in map(GPU_LINE.match, lines) if m]
    migs = [(m.group(1), m.group(2)) for m in map(MIG_LINE.match, lines) if m]
    assert len(gpus) + len(migs) == len(lines), lines
    return gpus, migs


def settle(what: str, probe: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def validator_ready(kube: KubeClient) -> bool:
    pods = kube.list_pods("gpu-operator")
    return any(p.name.startswith("nvidia-operator-validator") and p.ready for p in pods)


def gpu_resources(kube: KubeClient, lab: Lab) -> dict[str, str]:
    allocatable = kube.get_node(lab.nodes[0].name).allocatable
    return {k: v for k, v in allocatable.items() if k.startswith("nvidia.com/")}


def advertises(kube: KubeClient, lab: Lab, wanted: dict[str, str]) -> None:
    settle(f"the node to advertise {wanted}", lambda: gpu_resources(kube, lab) == wanted)


def run_pod(kube: KubeClient, lab: Lab, name: str, resource: str) -> list[str]:
    """A pod asking one device of `resource`, through the node's containerd: its log lines."""
    node = lab.nodes[0].name
    manifest = smoke_pod_manifest(
        name, node, "mig-test", SMOKE_IMAGE, resource, command=("nvidia-smi", "-L")
    )
    kube.create_pod("default", manifest)
    try:
        settle(
            f"{name} to end",
            lambda: kube.get_pod("default", name).phase in ("Succeeded", "Failed"),
        )
        assert kube.get_pod("default", name).phase == "Succeeded"
        return kube.read_pod_log("default", name, SMOKE_CONTAINER).splitlines()
    finally:
        kube.delete_pod("default", name, grace_period_s=0, missing_ok=True)


def manager_pods(lab: Lab, home: Path) -> list[dict[str, Any]]:
    """`kubectl get pods -n gpu-operator -l app=nvidia-mig-manager` as JSON items."""
    listing = kubectl(
        lab, home, "get", "pods", "-n", "gpu-operator", "-l", "app=nvidia-mig-manager", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(listing)["items"]
    return items


def manager_log(lab: Lab, home: Path) -> list[str]:
    """`kubectl logs` of the node's MIG manager pod."""
    [pod] = manager_pods(lab, home)
    name = str(pod["metadata"]["name"])
    return kubectl(lab, home, "logs", "-n", "gpu-operator", name).splitlines()


def test_the_mig_manager_runs_as_a_pod_on_the_node(lab: Lab, home: Path) -> None:
    text = kubectl(lab, home, "get", "pods", "-n", "gpu-operator", "-l", "app=nvidia-mig-manager")
    rows = [line.split() for line in text.splitlines()[1:]]
    assert len(rows) == len(lab.nodes) == 1, text
    assert rows[0][0].startswith("nvidia-mig-manager-") and rows[0][1:3] == ["1/1", "Running"]
    [pod] = manager_pods(lab, home)
    assert pod["spec"]["nodeName"] == lab.nodes[0].name


def test_lab_up_starts_with_mig_disabled(lab: Lab, kube: KubeClient) -> None:
    labels = kube.get_node(lab.nodes[0].name).labels
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["nvidia.com/mig.config"] == "all-disabled"
    assert labels[STATE] == "success"
    gpus, migs = node_listing(lab)
    assert len(gpus) == 2 and migs == []


def test_single_strategy_layout_shows_on_the_node_and_in_a_pod(
    lab: Lab, kube: KubeClient, home: Path
) -> None:
    set_strategy(lab, home, "single")
    configure(lab, kube, home, "all-1g.5gb")
    log = manager_log(lab, home)
    change = log[log.index("Updating to MIG config: all-1g.5gb") :]
    for line in (
        "Asserting that the requested configuration is present in the configuration file",
        "Selected MIG configuration is valid",
        "Applying the selected MIG config to the node",
        "Restarting all GPU clients previously shutdown in Kubernetes by reenabling their "
        "component-specific nodeSelector labels",
        "MIG configuration applied successfully",
    ):
        assert line in change, change
    gpus, migs = node_listing(lab)
    assert len(gpus) == 2
    assert [profile for profile, _ in migs] == ["1g.5gb"] * 14
    assert len({uuid for _, uuid in migs}) == 14
    advertises(kube, lab, {"nvidia.com/gpu": "14"})
    settle("the validator, paused for the change, to be Ready again", lambda: validator_ready(kube))
    labels = kube.get_node(lab.nodes[0].name).labels
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/gpu.count"] == "14"
    log = run_pod(kube, lab, "mig-single", "nvidia.com/gpu")
    assert len(log) == 2 and GPU_LINE.match(log[0]), log
    found = MIG_LINE.match(log[1])
    assert found is not None and (found.group(1), found.group(2)) in migs, log


def test_mixed_strategy_advertises_each_profile(lab: Lab, kube: KubeClient, home: Path) -> None:
    set_strategy(lab, home, "mixed")
    configure(lab, kube, home, "all-balanced")
    _, migs = node_listing(lab)
    assert sorted(p for p, _ in migs) == ["1g.5gb"] * 4 + ["2g.10gb"] * 2 + ["3g.20gb"] * 2
    advertises(
        kube,
        lab,
        {
            "nvidia.com/mig-1g.5gb": "4",
            "nvidia.com/mig-2g.10gb": "2",
            "nvidia.com/mig-3g.20gb": "2",
        },
    )
    labels = kube.get_node(lab.nodes[0].name).labels
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-2g.10gb.count"] == "2"
    log = run_pod(kube, lab, "mig-mixed", "nvidia.com/mig-2g.10gb")
    assert len(log) == 2 and GPU_LINE.match(log[0]), log
    found = MIG_LINE.match(log[1])
    assert found is not None and found.group(1) == "2g.10gb"
    assert (found.group(1), found.group(2)) in migs
    set_strategy(lab, home, "single")


def lab_cli(lab: Lab, *words: str) -> int:
    return main(["lab", *words, "--lab-dir", str(lab.lab_dir)])


def test_a_failing_mig_manager_leaves_the_gpus_as_they_were(
    lab: Lab, kube: KubeClient, home: Path
) -> None:
    node = lab.nodes[0].name
    configure(lab, kube, home, "all-3g.20gb")
    before = node_listing(lab)
    assert lab_cli(lab, "break", "mig-manager-failed", node) == 0
    try:
        configure(lab, kube, home, "all-1g.10gb", state="failed")
        assert node_listing(lab) == before
        log = manager_log(lab, home)
        change = log[log.index("Updating to MIG config: all-1g.10gb") :]
        assert "Unable to apply MIG config" in change, change
        assert "MIG configuration applied successfully" not in change
        labels = kube.get_node(node).labels
        assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
        advertises(kube, lab, {"nvidia.com/gpu": "4"})
        configure(lab, kube, home, "all-3g.20gb")  # the layout the GPUs have: success, even broken
        assert node_listing(lab) == before
    finally:
        assert lab_cli(lab, "heal", node) == 0
    configure(lab, kube, home, "all-1g.10gb")
    assert [p for p, _ in node_listing(lab)[1]] == ["1g.10gb"] * 8


def boot_id(lab: Lab) -> str:
    return ssh_check(lab, lab.nodes[0], ["cat", "/proc/sys/kernel/random/boot_id"]).strip()


def test_a_mode_change_that_needs_a_reboot_reboots_the_node(
    lab: Lab, kube: KubeClient, home: Path
) -> None:
    node = lab.nodes[0].name
    configure(lab, kube, home, "all-7g.40gb")  # MIG mode on, without a reboot
    before = boot_id(lab)
    assert lab_cli(lab, "break", "mig-mode-needs-reboot", node) == 0
    try:
        configure(lab, kube, home, "all-1g.5gb")  # same mode: no reboot
        assert boot_id(lab) == before
        kubectl(
            lab, home, "label", f"node/{node}", "nvidia.com/mig.config=all-disabled", "--overwrite"
        )
        settle("the state rebooting", lambda: kube.get_node(node).labels.get(STATE) == "rebooting")
        configure(lab, kube, home, "all-disabled")
        assert boot_id(lab) != before
        assert node_listing(lab)[1] == []
        advertises(kube, lab, {"nvidia.com/gpu": "2"})
    finally:
        assert lab_cli(lab, "heal", node) == 0
