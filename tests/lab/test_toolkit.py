"""The lab's NVIDIA container toolkit, and rollout's writes surviving it.

The node script renders the drop-in exactly as rollout's model of the toolkit does, for
the real `config dump` of each containerd series. On a lab of its own (1.6, 1.7, 2.1), after
`rollout apply` of the example registry plan, the effective config keeps the intent and
the nvidia handlers when the toolkit restarts (its pods deleted), keeps the intent when it
exits (its deploy label false: the drop-in deleted, and with it the handlers it added), and
both again when it comes back, and both after every node reboots. That lab runs the
realistic timing profile, which the last test checks.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.containerd.binaries import find_containerd
from rollout.containerd.toolkit import NVIDIA_RUNTIMES, render_toolkit_dropin
from rollout.lab.cluster import CONTEXT, Lab, bring_up_lab, launch_controlplane, tear_down_lab
from rollout.lab.nodes import RUNNING_RECORD, NodeSpec
from rollout.lab.simulation.probe import handlers_in_dump
from rollout.lab.simulation.timing import REALISTIC, set_timing_profile
from rollout.lab.toolkit import TOOLKIT_DROP_IN, TOOLKIT_UNIT, toolkit_script_text
from rollout.transports.kube import KubeClient
from tests.examples import edited_plan
from tests.lab.labapi import apply_args, wait_for
from tests.lab.test_cluster_shared import (
    OWN_ADDRESS_PREFIX,
    lab_options,
    require_lab_prerequisites,
    ssh_check,
    ssh_run,
)

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

SERIES = ("1.6", "1.7", "2.1")
TOOLKIT_LABEL = "nvidia.com/gpu.deploy.container-toolkit"
SETTLE_S = 90.0


# --------------------------------------------------------------- the node script


@pytest.mark.parametrize("series", SERIES)
def test_the_node_script_renders_the_toolkits_drop_in(series: str, tmp_path: Path) -> None:
    script = tmp_path / "nvidia-toolkit"
    script.write_text(toolkit_script_text())
    config = tmp_path / "config.toml"
    config.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nsandbox_image = "x"\n')
    dump = subprocess.run(
        [str(find_containerd(series)), "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rendered = subprocess.run(
        ["python3", str(script), "render"], input=dump, capture_output=True, text=True, check=True
    ).stdout
    drop_in = tomllib.loads(rendered)
    assert drop_in == render_toolkit_dropin(tomllib.loads(dump))
    assert set(NVIDIA_RUNTIMES) <= handlers_in_dump(drop_in)
    assert drop_in["version"] == (3 if series == "2.1" else 2)


# ------------------------------------------------------------------------ the lab


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A lab of its own under the realistic timing profile (its control plane started after
    the profile is written into lab.json)."""
    require_lab_prerequisites()
    lab_dir = tmp_path_factory.mktemp("toolkit") / "lab"
    options = lab_options(lab_dir, SERIES, 1, OWN_ADDRESS_PREFIX)
    built = bring_up_lab(dataclasses.replace(options, controlplane=False), progress=quiet)
    try:
        set_timing_profile(built.lab_dir, "realistic")
        launch_controlplane(built.lab_dir, built.api_url, quiet)
        yield built
    finally:
        tear_down_lab(lab_dir, progress=quiet)


def effective(lab: Lab, node: NodeSpec) -> tuple[str, set[str]]:
    """(registry config_path, runtime handlers) of `containerd config dump` on the node."""
    dump = tomllib.loads(ssh_check(lab, node, ["containerd", "config", "dump"]))
    plugins: dict[str, Any] = dump["plugins"]
    registry = (
        plugins.get("io.containerd.cri.v1.images") or plugins["io.containerd.grpc.v1.cri"]
    ).get("registry") or {}
    return str(registry.get("config_path", "")), handlers_in_dump(dump)


def boot_id(lab: Lab, node: NodeSpec) -> str:
    return ssh_run(lab, node, ["cat", "/proc/sys/kernel/random/boot_id"]).stdout.strip()


def containerd_restarts(lab: Lab, node: NodeSpec) -> int:
    out = ssh_check(lab, node, ["systemctl", "show", "containerd", "-p", "NRestarts"])
    return int(out.strip().split("=")[1])


def active(lab: Lab, node: NodeSpec, unit: str) -> bool:
    return ssh_run(lab, node, ["systemctl", "is-active", "--quiet", unit]).ok


def settled(lab: Lab, node: NodeSpec, restarts_at_least: int, toolkit: bool) -> bool:
    return (
        containerd_restarts(lab, node) >= restarts_at_least
        and active(lab, node, "containerd")
        and active(lab, node, TOOLKIT_UNIT) == toolkit
        and ssh_run(lab, node, ["test", "-e", TOOLKIT_DROP_IN]).ok == toolkit
    )


def wait_settled(
    lab: Lab, restarts: dict[str, int], more: int, *, toolkit: bool, what: str
) -> None:
    """Wait until every node's containerd has restarted `more` times since `restarts` and the
    toolkit runs (or not) as `toolkit` says."""
    for node in lab.nodes:
        wait_for(
            lambda n=node: settled(lab, n, restarts[n.name] + more, toolkit=toolkit),
            SETTLE_S,
            what=f"{node.name}: {what}",
            interval_s=0.5,
        )


def assert_kept(lab: Lab, intent: dict[str, str], when: str, *, handlers: bool = True) -> None:
    """The intent is in effect; the toolkit's handlers too, or (toolkit gone) none of them."""
    for node in lab.nodes:
        config_path, found = effective(lab, node)
        assert config_path == intent[node.name], f"{node.name} {when}: registry lost"
        if handlers:
            assert set(NVIDIA_RUNTIMES) <= found, f"{node.name} {when}: handlers {found}"
        else:
            assert not set(NVIDIA_RUNTIMES) & found, f"{node.name} {when}: handlers {found}"


@pytest.mark.lab
def test_the_toolkit_unit_configured_every_node_at_lab_up(lab: Lab) -> None:
    for node in lab.nodes:
        assert active(lab, node, TOOLKIT_UNIT), node.name
        drop_in = tomllib.loads(ssh_check(lab, node, ["cat", TOOLKIT_DROP_IN]))
        assert set(NVIDIA_RUNTIMES) <= handlers_in_dump(drop_in)
        assert set(NVIDIA_RUNTIMES) <= effective(lab, node)[1]
        journal = ssh_check(lab, node, ["journalctl", "-u", TOOLKIT_UNIT, "--no-pager"])
        assert "sent SIGHUP to containerd" in journal


@pytest.mark.lab
def test_rollouts_writes_survive_the_toolkit_restarting_exiting_and_a_reboot(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    # The example plan, every node in one wave (the order of nodes is not what is tested).
    plan = edited_plan(
        tmp_path, 'waves: [1, "50%"]\n  max_unavailable: 1', 'waves: ["100%"]\n  max_unavailable: 3'
    )
    assert main(apply_args(lab, plan, tmp_path / "state")) == 0
    intent = {node.name: effective(lab, node)[0] for node in lab.nodes}
    assert all(intent.values()), intent
    assert_kept(lab, intent, "after apply")

    # Toolkit restart: its pods deleted and recreated; the unit stops, then starts again.
    restarts = {n.name: containerd_restarts(lab, n) for n in lab.nodes}
    for pod in kube.list_pods("gpu-operator", label_selector="app=" + TOOLKIT_DS):
        kube.delete_pod("gpu-operator", pod.name)
    wait_settled(lab, restarts, 2, toolkit=True, what="the toolkit to stop and start again")
    assert_kept(lab, intent, "after a toolkit restart")

    # Toolkit exit: the drop-in deleted, containerd signalled.
    restarts = {n.name: containerd_restarts(lab, n) for n in lab.nodes}
    for node in lab.nodes:
        kube.patch_node_labels(node.name, {TOOLKIT_LABEL: "false"})
    try:
        wait_settled(lab, restarts, 1, toolkit=False, what="the toolkit to exit")
        # The toolkit unloads its handlers on exit; nothing of rollout's brings a stale copy back.
        assert_kept(lab, intent, "after the toolkit exited", handlers=False)
    finally:
        restarts = {n.name: containerd_restarts(lab, n) for n in lab.nodes}
        for node in lab.nodes:
            kube.patch_node_labels(node.name, {TOOLKIT_LABEL: "true"})
    wait_settled(lab, restarts, 1, toolkit=True, what="the toolkit to come back")
    assert_kept(lab, intent, "after the toolkit came back")
    # A node reboot: the toolkit stops with the node (drop-in deleted), runs again after it.
    boots = {n.name: boot_id(lab, n) for n in lab.nodes}
    for node in lab.nodes:
        ssh_run(lab, node, ["systemctl", "reboot"])
    for node in lab.nodes:
        wait_for(
            lambda n=node: (
                boot_id(lab, n) not in ("", boots[n.name]) and settled(lab, n, 0, toolkit=True)
            ),
            SETTLE_S,
            what=f"{node.name}: booted again, its toolkit run",
            interval_s=0.5,
        )
    assert_kept(lab, intent, "after a reboot")
    # the GPUs: every node advertises its GPU again
    wait_for(
        lambda: all(
            kube.node_allocatable(n.name).get("nvidia.com/gpu")
            == kube.node_capacity(n.name).get("nvidia.com/gpu")
            not in (None, "0")
            for n in lab.nodes
        ),
        SETTLE_S,
        what="every node to advertise its GPU",
        interval_s=0.5,
    )


TOOLKIT_DS = "nvidia-container-toolkit-daemonset"


@pytest.fixture(scope="module")
def core(lab: Lab) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(str(lab.kubeconfig), context=CONTEXT))


def ready_condition(core: Any, node: str) -> tuple[str, str]:
    for condition in core.read_node(node).status.conditions or []:
        if condition.type == "Ready":
            return str(condition.status), str(condition.message)
    return "", ""


def plugin_pods(core: Any, node: str) -> list[Any]:
    return list(
        core.list_namespaced_pod(
            "gpu-operator",
            label_selector="app=nvidia-device-plugin-daemonset",
            field_selector=f"spec.nodeName={node}",
        ).items
    )


def allocatable(core: Any, node: str) -> str | None:
    return (core.read_node(node).status.allocatable or {}).get("nvidia.com/gpu")


@pytest.mark.lab
def test_the_realistic_profile(lab: Lab, core: Any) -> None:
    """NotReady while containerd restarts, a deleted pod Terminating while it stops (within
    its grace), the device plugin registering seconds after it runs, CrashLoopBackOff's
    10 s back-off."""
    node = lab.nodes[1]
    ssh_check(lab, node, ["systemctl", "kill", "-s", "HUP", "containerd"])
    wait_for(
        lambda: ready_condition(core, node.name) == ("False", "container runtime is down"),
        10,
        what="NotReady while containerd restarts",
        interval_s=0.1,
    )
    wait_for(lambda: ready_condition(core, node.name)[0] == "True", 30, interval_s=0.2)

    (plugin,) = plugin_pods(core, node.name)
    deleted_at = time.monotonic()
    core.delete_namespaced_pod(plugin.metadata.name, "gpu-operator")
    still = [p for p in plugin_pods(core, node.name) if p.metadata.uid == plugin.metadata.uid]
    assert still and still[0].metadata.deletion_timestamp, "Terminating while it stops"
    wait_for(
        lambda: all(p.metadata.uid != plugin.metadata.uid for p in plugin_pods(core, node.name)),
        float(REALISTIC["pod_termination_s"]),
        what="the deleted plugin to go within its grace",
        interval_s=0.1,
    )
    assert time.monotonic() - deleted_at >= REALISTIC["container_stop_s"] - 0.5
    new = wait_for(
        lambda: next(
            (p for p in plugin_pods(core, node.name) if p.status.phase == "Running"), None
        ),
        30,
        what="a new device plugin running",
        interval_s=0.1,
    )
    running_at = time.monotonic()
    assert allocatable(core, node.name) == "0", "running, not registered yet"
    wait_for(lambda: allocatable(core, node.name) == "1", 30, what="registered", interval_s=0.1)
    assert time.monotonic() - running_at >= REALISTIC["plugin_registration_s"] - 1.5

    crash = "lab.rollout/device-plugin-crash"
    core.patch_node(node.name, {"metadata": {"annotations": {crash: "nvml: unknown error"}}})
    try:

        def status() -> Any:
            pod = core.read_namespaced_pod(new.metadata.name, "gpu-operator")
            return pod.status.container_statuses[0]

        first = wait_for(
            lambda: (s := status()).restart_count >= 1 and s, 30, what="a crash", interval_s=0.1
        )
        assert first.state.waiting.reason == "CrashLoopBackOff"
        assert first.state.waiting.message.startswith("back-off 10s restarting failed container=")
        # the kubelet writes the pod's status, then the node's, in one pass: the node's may
        # still be on its way when the pod's is read (bounded by the next pass, not the grace)
        wait_for(
            lambda: allocatable(core, node.name) == "0",
            2 * REALISTIC["tick_s"],
            what="allocatable 0 in the pass that saw the crash",
            interval_s=0.05,
        )
        time.sleep(REALISTIC["crash_backoff_s"] / 2)
        assert status().restart_count == first.restart_count, "no restart within the back-off"
    finally:
        core.patch_node(node.name, {"metadata": {"annotations": {crash: None}}})


@pytest.mark.lab
def test_a_killed_node_is_unknown_its_record_cleared_and_it_comes_back(lab: Lab, core: Any) -> None:
    """Node health is derived: a power cut leaves the running-config record on disk; the
    control plane sees the node's nspawn gone, marks it Unknown and removes the record; booted
    again, the node's toolkit re-runs and the GPU comes back."""
    from rollout.lab.nodefaults import boot_node_again, kill_lab_node

    node = lab.nodes[2]
    record = lab.node_dirs(node).host_path(RUNNING_RECORD)
    assert record.is_file()
    kill_lab_node(lab, node.name)
    wait_for(
        lambda: (
            ready_condition(core, node.name) == ("Unknown", "Kubelet stopped posting node status.")
        ),
        15,
        what="the killed node Unknown",
        interval_s=0.2,
    )
    wait_for(lambda: not record.exists(), 15, what="the stale record removed", interval_s=0.2)
    boot_node_again(lab, node.name)
    wait_for(
        lambda: (
            ready_condition(core, node.name)[0] == "True"
            and settled(lab, node, 1, toolkit=True)
            and allocatable(core, node.name) == "1"
        ),
        SETTLE_S,
        what="the node Ready, its toolkit run again, its GPU back",
        interval_s=0.5,
    )
