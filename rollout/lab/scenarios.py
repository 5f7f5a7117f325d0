"""`rollout lab break|heal`: inject the failures of the troubleshooting tree into the lab.

Each scenario changes the lab for real: files on a node over its sshd, containerd restarted
through systemd, objects through the Kubernetes API. Before it changes anything it records
how to put each thing back (the bytes of /etc/containerd, a label's old value, the pods it
created) in `<lab dir>/scenarios.json`, so `heal` restores the lab exactly as it found it,
even after something else (a `rollout apply` of a `diagnose --fix` plan) changed it further.

Some failures have no real cause in a lab without GPUs; they use the lab's stand-ins:
an Xid line in the node's kernel-log stand-in (`/var/log/rollout-lab/kern.log`, which the
node's `dmesg` stand-in prints and the simulated device plugin reads), the loaded-module
version the stand-in `nvidia-smi` compares with its library, and node annotations the
simulated kubelet reads (`lab.rollout/not-ready`, `lab.rollout/device-plugin-crash`).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rollout.commands import CommandResult
from rollout.errors import BadInput, RolloutError
from rollout.lab.cluster import CONTEXT, Lab, LabFailed
from rollout.lab.image import DRIVER_VERSIONS
from rollout.lab.nodes import CONTAINERD_CONFIG, NVIDIA_DROP_IN, NodeSpec
from rollout.lab.simulation.clusterpolicy import CONFIG_NAME_ENV
from rollout.lab.simulation.gpuoperator import (
    CLUSTER_POLICY_NAME,
    DEVICE_PLUGIN,
    DEVICE_PLUGIN_CRASH_ANNOTATION,
    DRIVER,
    FAIL_UPGRADE_ANNOTATION,
    NOT_READY_ANNOTATION,
    OPERATOR_NAMESPACE,
    UPGRADE_STATE_LABEL,
    VALIDATOR,
    VALIDATOR_STUCK_ANNOTATION,
)
from rollout.lab.simulation.miglayouts import REBOOT_KNOB_FILE
from rollout.lab.simulation.migmanager import FAILED_ANNOTATION as MIG_FAILED_ANNOTATION
from rollout.lab.simulation.profiles import CONFIG_LABEL
from rollout.transports.errors import Invalid
from rollout.transports.kube import ConfigMap, KubeClient
from rollout.transports.local import LocalRunner

RECORD_FILE = "scenarios.json"
REGISTRY_DROP_IN = "/etc/containerd/conf.d/registry.toml"
NAIVE_REGISTRY = (
    '[plugins."io.containerd.grpc.v1.cri".registry]\nconfig_path = "/etc/containerd/certs.d"\n'
)
MISSING_IMPORT = "/etc/containerd/rollout-lab-missing.toml"
KERNEL_LOG = "/var/log/rollout-lab/kern.log"
MODULE_VERSION_FILE = "/var/lib/rollout-lab/nvidia-module-version"
# GPU indices with row remaps pending: the stand-in dcgmi fails their `software` test
ROW_REMAP_FILE = "/var/lib/rollout-lab/row-remap-pending"
PROFILES_CONFIGMAP = "rollout-lab-device-plugin-configs"
MISSING_PROFILE = "rollout-lab-missing-profile"
POD_NAMESPACE = "default"
POD_PREFIX = "lab-break"
MISSING_RUNTIME_CLASS = "rollout-lab-missing"
UNHEALTHY_GPU = 1
XID = 79  # fallen off the bus: the device plugin marks the GPU unhealthy (FACTS.md)
PLUGIN_CRASH_MESSAGE = (
    "E1130 12:00:00.000000       1 main.go:132] error starting plugins: error creating "
    "plugin manager: unable to create plugin manager: nvml init failed: ERROR_UNKNOWN"
)
NVML_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
VALIDATOR_STUCK_MESSAGE = "cuda-validation: the CUDA workload never completes"
MIG_REBOOT_KNOB = f"/{REBOOT_KNOB_FILE}"
MIG_FAILED_MESSAGE = "mig-parted: error creating GPU instance: Insufficient Resources"
SETTLE_TIMEOUT_S = 60.0
POLL_S = 0.5
# The device plugin's no-sharing profile, a ConfigMap key the operator accepts.
NO_SHARING_PROFILE = "version: v1\n"
DEFAULT = "default"
# The two kinds of node metadata a scenario sets, named as its undo records name them.
NodeMetadata = Literal["label", "annotation"]


class ScenarioFailed(RolloutError):
    """A scenario could not be injected or healed."""


@dataclass(frozen=True)
class Scenario:
    """One injectable failure: what it is, which nodes it suits, and how to inject it."""

    name: str
    summary: str
    inject: Callable[[LabAccess, NodeSpec, list[dict[str, Any]]], None]
    needs_1x: bool = False


@dataclass(frozen=True)
class LabAccess:
    """The lab's nodes (over SSH) and API (the official client), as break and heal use them."""

    lab: Lab
    kube: KubeClient

    def ssh(
        self, node: NodeSpec, argv: list[str], *, stdin: bytes | None = None, timeout_s: float = 60
    ) -> CommandResult:
        return LocalRunner().run(
            self.lab.ssh.argv(node.address, argv), stdin=stdin, timeout_s=timeout_s
        )

    def ssh_check(self, node: NodeSpec, argv: list[str], *, stdin: bytes | None = None) -> str:
        result = self.ssh(node, argv, stdin=stdin)
        if not result.ok:
            raise ScenarioFailed(
                f"{node.name}: `{' '.join(argv)}` exited {result.exit_code}: {result.tail()}"
            )
        return result.stdout

    def api(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """A raw JSON request, for kinds KubeClient does not serve (RuntimeClass, deletes)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.lab.api_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            if method == "DELETE" and error.code == 404:
                return None
            detail = error.read()[:300]
            raise ScenarioFailed(f"{method} {path}: HTTP {error.code}: {detail!r}") from error
        except (urllib.error.URLError, OSError) as error:
            raise ScenarioFailed(f"{method} {path}: {error}") from error


# ------------------------------------------------------------------ node side


def _snapshot_containerd(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    """Record /etc/containerd whole (bytes, modes): heal puts back exactly this tree."""
    tar = access.ssh_check(node, ["sh", "-c", "tar -C / -cf - etc/containerd | base64 -w0"])
    undo.append({"kind": "containerd-tree", "node": node.name, "tar_b64": tar.strip()})


def _restart_containerd(access: LabAccess, node: NodeSpec, *, expect_active: bool) -> None:
    access.ssh(node, ["systemctl", "reset-failed", "containerd"])
    result = access.ssh(node, ["systemctl", "restart", "containerd"])
    if expect_active and not result.ok:
        raise ScenarioFailed(f"{node.name}: containerd did not restart: {result.tail()}")
    state = access.ssh(node, ["systemctl", "is-active", "containerd"]).stdout.strip()
    if expect_active and state != "active":
        raise ScenarioFailed(f"{node.name}: containerd is {state} after a restart")
    if not expect_active and state == "active":
        raise ScenarioFailed(f"{node.name}: containerd started although it should refuse to")


def _write_node_file(access: LabAccess, node: NodeSpec, path: str, data: bytes) -> None:
    script = f"mkdir -p \"$(dirname '{path}')\" && cat > '{path}'"
    access.ssh_check(node, ["sh", "-c", script], stdin=data)


def _record_node_file(
    access: LabAccess, node: NodeSpec, path: str, undo: list[dict[str, Any]]
) -> None:
    """Record a file's bytes and mode, or that it is absent."""
    result = access.ssh(node, ["sh", "-c", f"stat -c %a '{path}' && base64 -w0 '{path}'"])
    if result.ok:
        mode, _, content = result.stdout.partition("\n")
        undo.append(
            {"kind": "file", "node": node.name, "path": path, "mode": mode, "b64": content.strip()}
        )
    else:
        undo.append({"kind": "file", "node": node.name, "path": path, "mode": None, "b64": None})


def _restart_device_plugin(access: LabAccess, node: NodeSpec) -> None:
    """The device plugin's next start, as an operator restart or a config change makes it.

    A running plugin survives a containerd restart (KillMode=process keeps its shim): a lost
    handler shows only when the plugin's pod starts again, so each scenario that loses one
    restarts it, as the incident it rehearses did.
    """
    _restart_operand(access, node, DEVICE_PLUGIN.name)


def _restart_operand(access: LabAccess, node: NodeSpec, app: str) -> None:
    """Delete the node's pods of the operand `app`; wait for their replacement to exist."""
    selector = f"app={app}"
    old = {
        p.name
        for p in access.kube.list_pods(OPERATOR_NAMESPACE, selector, f"spec.nodeName={node.name}")
    }
    for name in old:
        access.kube.delete_pod(OPERATOR_NAMESPACE, name, missing_ok=True)
    _wait(
        f"{node.name}'s {app} pod to be replaced",
        lambda: any(
            p.name not in old
            for p in access.kube.list_pods(
                OPERATOR_NAMESPACE, selector, f"spec.nodeName={node.name}"
            )
        ),
    )


def inject_shadowing(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    _snapshot_containerd(access, node, undo)
    _write_node_file(access, node, REGISTRY_DROP_IN, NAIVE_REGISTRY.encode())
    _restart_containerd(access, node, expect_active=True)
    _restart_device_plugin(access, node)


def inject_toolkit_removed(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    _snapshot_containerd(access, node, undo)
    access.ssh_check(node, ["rm", "-f", NVIDIA_DROP_IN])
    _restart_containerd(access, node, expect_active=True)
    _restart_device_plugin(access, node)


def inject_bad_import(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    _snapshot_containerd(access, node, undo)
    # One more entry in the main config's imports, naming a file that does not exist.
    script = (
        f"sed -i 's|^imports = \\[|imports = [\"{MISSING_IMPORT}\", |' {CONTAINERD_CONFIG} "
        f"&& grep -q '{MISSING_IMPORT}' {CONTAINERD_CONFIG}"
    )
    access.ssh_check(node, ["sh", "-c", script])
    _restart_containerd(access, node, expect_active=False)


def inject_unhealthy_device(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    if len(node.gpus) <= UNHEALTHY_GPU:
        raise BadInput(f"{node.name} has {len(node.gpus)} GPUs; this scenario needs 2")
    _record_node_file(access, node, KERNEL_LOG, undo)
    bus = "0000:%02X:00" % (7 + 8 * UNHEALTHY_GPU)  # the stand-in nvidia-smi's bus ids
    # stamped as the kernel stamps it, seconds since boot: the Xid gate reads the time
    uptime = float(access.ssh_check(node, ["cut", "-d ", "-f1", "/proc/uptime"]))
    line = (
        f"[{uptime:12.6f}] NVRM: Xid (PCI:{bus}): {XID}, pid=0, name=kworker, "
        "GPU has fallen off the bus.\n"
    )
    current = access.ssh(node, ["cat", KERNEL_LOG]).stdout
    _write_node_file(access, node, KERNEL_LOG, (current + line).encode())


def inject_row_remap_pending(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    if len(node.gpus) <= UNHEALTHY_GPU:
        raise BadInput(f"{node.name} has {len(node.gpus)} GPUs; this scenario needs 2")
    _record_node_file(access, node, ROW_REMAP_FILE, undo)
    _write_node_file(access, node, ROW_REMAP_FILE, f"{UNHEALTHY_GPU}\n".encode())


def inject_driver_mismatch(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    library = access.ssh_check(node, ["cat", "/usr/lib/rollout-lab/nvidia-driver/version"]).strip()
    loaded = next(v for v in DRIVER_VERSIONS if v != library)
    _record_node_file(access, node, MODULE_VERSION_FILE, undo)
    _write_node_file(access, node, MODULE_VERSION_FILE, (loaded + "\n").encode())
    _annotate(access, node, DEVICE_PLUGIN_CRASH_ANNOTATION, NVML_MISMATCH, undo)


# ------------------------------------------------------------------- API side


def _label(
    access: LabAccess, node: NodeSpec, key: str, value: str, undo: list[dict[str, Any]]
) -> None:
    _set_node_metadata(access, node, "label", key, value, undo)


def _annotate(
    access: LabAccess, node: NodeSpec, key: str, value: str, undo: list[dict[str, Any]]
) -> None:
    _set_node_metadata(access, node, "annotation", key, value, undo)


def _set_node_metadata(
    access: LabAccess,
    node: NodeSpec,
    kind: NodeMetadata,
    key: str,
    value: str,
    undo: list[dict[str, Any]],
) -> None:
    """Set a label or an annotation of the node, recording its old value (None: absent)."""
    found = access.kube.get_node(node.name)
    previous = (found.labels if kind == "label" else found.annotations).get(key)
    undo.append({"kind": kind, "node": node.name, "key": key, "value": previous})
    _patch_node_metadata(access, node.name, kind, key, value)


def _patch_node_metadata(
    access: LabAccess, node: str, kind: NodeMetadata, key: str, value: str | None
) -> None:
    """Set (None: remove) one label or annotation of the node."""
    if kind == "label":
        access.kube.patch_node_labels(node, {key: value})
    else:
        access.kube.patch_node_annotations(node, {key: value})


def _create_pod(access: LabAccess, manifest: dict[str, Any], undo: list[dict[str, Any]]) -> None:
    name = manifest["metadata"]["name"]
    undo.append({"kind": "pod", "namespace": POD_NAMESPACE, "name": name})
    access.kube.create_pod(POD_NAMESPACE, manifest)


def _pod(name: str, node: NodeSpec, resources: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": POD_PREFIX}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "command": ["sleep", "infinity"],
                    "resources": resources,
                }
            ],
            **spec,
        },
    }


def inject_profile_missing_key(
    access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]
) -> None:
    policy = access.kube.get_cluster_policy(CLUSTER_POLICY_NAME)
    previous = ((policy.get("spec") or {}).get("devicePlugin") or {}).get("config")
    config = previous or {}
    if not config.get("name"):
        # The label names a key of the ConfigMap the ClusterPolicy names: give it one,
        # whose only profile is what every node runs today (no sharing).
        undo.append({"kind": "delete", "path": _configmap_path(PROFILES_CONFIGMAP)})
        access.kube.create_configmap(
            ConfigMap(OPERATOR_NAMESPACE, PROFILES_CONFIGMAP, data={DEFAULT: NO_SHARING_PROFILE})
        )
        undo.append({"kind": "device-plugin-config", "config": previous})
        access.kube.patch_cluster_policy(
            CLUSTER_POLICY_NAME,
            {
                "spec": {
                    "devicePlugin": {"config": {"name": PROFILES_CONFIGMAP, "default": "default"}}
                }
            },
        )
        _wait_plugin_rollout(access, PROFILES_CONFIGMAP)
    else:
        configmap = access.kube.get_configmap(OPERATOR_NAMESPACE, str(config["name"]))
        undo.append(
            {
                "kind": "configmap-data",
                "namespace": OPERATOR_NAMESPACE,
                "name": configmap.name,
                "data": dict(configmap.data),
            }
        )
    _label(access, node, CONFIG_LABEL, MISSING_PROFILE, undo)


def _configmap_path(name: str) -> str:
    return f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/configmaps/{name}"


def inject_upgrade_failed(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    """What a failed driver upgrade leaves: the node labelled upgrade-failed while its driver
    container fails to install. The label alone would not stay: the upgrade controller
    clears it once the driver pod is in sync and Ready (FACTS.md), so the node's driver pod
    is restarted under the lab's fail knob first (docs/drivers-operator.md)."""
    _annotate(access, node, FAIL_UPGRADE_ANNOTATION, "true", undo)
    for pod in access.kube.list_pods(
        OPERATOR_NAMESPACE, f"app={DRIVER.name}", f"spec.nodeName={node.name}"
    ):
        access.kube.delete_pod(pod.namespace, pod.name, missing_ok=True)
    _label(access, node, UPGRADE_STATE_LABEL, "upgrade-failed", undo)


def inject_slots_used(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    free = int(access.kube.node_allocatable(node.name).get("nvidia.com/gpu") or 0)
    if free < 1:
        raise ScenarioFailed(f"{node.name} advertises no nvidia.com/gpu to use up")
    for i in range(free):
        name = f"{POD_PREFIX}-slots-{node.name}-{i}"
        _create_pod(access, _pod(name, node, {"limits": {"nvidia.com/gpu": "1"}}), undo)
    _wait(
        f"{free} pods holding {node.name}'s GPUs to run",
        lambda: all(
            access.kube.get_pod(POD_NAMESPACE, f"{POD_PREFIX}-slots-{node.name}-{i}").phase
            == "Running"
            for i in range(free)
        ),
    )


def inject_requests_without_limits(
    access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]
) -> None:
    """A Deployment's GPU request without a limit, as a real cluster shows it.

    The API refuses such a pod, so no pod object exists: what is left is the ReplicaSet
    controller's FailedCreate event, carrying the API's own words. The lab has no ReplicaSet
    controller: the pod is offered to the API as that controller would, and the event is
    written as it writes it, with the message the API answered.
    """
    owner = f"{POD_PREFIX}-no-limits-{node.name}"
    manifest = _pod(f"{owner}-x7k2p", node, {"requests": {"nvidia.com/gpu": "1"}})
    try:
        access.kube.create_pod(POD_NAMESPACE, manifest)
    except Invalid as refusal:
        message = refusal.message
    else:
        name = manifest["metadata"]["name"]
        undo.append({"kind": "pod", "namespace": POD_NAMESPACE, "name": name})
        raise ScenarioFailed("the API accepted a GPU request without a limit; a real one refuses")
    event = f"{owner}.{int(time.time())}"
    undo.append({"kind": "delete", "path": f"/api/v1/namespaces/{POD_NAMESPACE}/events/{event}"})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    access.api(
        "POST",
        f"/api/v1/namespaces/{POD_NAMESPACE}/events",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event, "namespace": POD_NAMESPACE},
            "involvedObject": {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": owner,
                "namespace": POD_NAMESPACE,
            },
            "reason": "FailedCreate",
            "message": f"Error creating: {message}",
            "type": "Warning",
            "source": {"component": "replicaset-controller"},
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
        },
    )


def inject_runtimeclass_missing(
    access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]
) -> None:
    # Admission refuses a pod naming a class that does not exist: the class goes after the
    # pod, as when an operator uninstall removes it under running workloads.
    path = f"/apis/node.k8s.io/v1/runtimeclasses/{MISSING_RUNTIME_CLASS}"
    undo.append({"kind": "delete", "path": path})
    access.api(
        "POST",
        "/apis/node.k8s.io/v1/runtimeclasses",
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": MISSING_RUNTIME_CLASS},
            "handler": MISSING_RUNTIME_CLASS,
        },
    )
    name = f"{POD_PREFIX}-runtimeclass-{node.name}"
    manifest = _pod(
        name, node, {"limits": {"nvidia.com/gpu": "1"}}, runtimeClassName=MISSING_RUNTIME_CLASS
    )
    _create_pod(access, manifest, undo)
    access.api("DELETE", path)


def inject_not_ready(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    _annotate(access, node, NOT_READY_ANNOTATION, "true", undo)


def inject_validator_stuck(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    _annotate(access, node, VALIDATOR_STUCK_ANNOTATION, VALIDATOR_STUCK_MESSAGE, undo)
    _restart_operand(access, node, VALIDATOR.name)


def inject_plugin_crash_loop(access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]) -> None:
    _annotate(access, node, DEVICE_PLUGIN_CRASH_ANNOTATION, PLUGIN_CRASH_MESSAGE, undo)


def inject_mig_mode_needs_reboot(
    access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]
) -> None:
    _record_node_file(access, node, MIG_REBOOT_KNOB, undo)
    _write_node_file(access, node, MIG_REBOOT_KNOB, b"MIG mode changes need a reboot\n")


def inject_mig_manager_failed(
    access: LabAccess, node: NodeSpec, undo: list[dict[str, Any]]
) -> None:
    _annotate(access, node, MIG_FAILED_ANNOTATION, MIG_FAILED_MESSAGE, undo)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "shadowing",
        "a registry drop-in after 99-nvidia.toml replaces the CRI table (containerd and the "
        "device plugin restarted)",
        inject_shadowing,
        needs_1x=True,
    ),
    Scenario(
        "toolkit-dropin-removed",
        "the toolkit's 99-nvidia.toml deleted (containerd and the device plugin restarted)",
        inject_toolkit_removed,
    ),
    Scenario(
        "containerd-bad-import",
        "config.toml imports a file that does not exist: containerd refuses to start",
        inject_bad_import,
        needs_1x=True,
    ),
    Scenario(
        "profile-label-missing-key",
        "nvidia.com/device-plugin.config names a key the ConfigMap lacks",
        inject_profile_missing_key,
    ),
    Scenario(
        "upgrade-failed",
        "nvidia.com/gpu-driver-upgrade-state=upgrade-failed",
        inject_upgrade_failed,
    ),
    Scenario("slots-used", "pods hold every GPU slot of the node", inject_slots_used),
    Scenario(
        "requests-without-limits",
        "a Deployment requests nvidia.com/gpu without a limit (the API refuses its pods)",
        inject_requests_without_limits,
    ),
    Scenario(
        "runtimeclass-missing",
        "a pod names a RuntimeClass that does not exist",
        inject_runtimeclass_missing,
    ),
    Scenario("not-ready", "the node's kubelet reports NotReady", inject_not_ready),
    Scenario(
        "validator-stuck",
        "the GPU Operator's validator restarts and its validations never pass: never Ready",
        inject_validator_stuck,
    ),
    Scenario(
        "plugin-crash-loop",
        "the device plugin pod crash-loops",
        inject_plugin_crash_loop,
    ),
    Scenario(
        "unhealthy-device",
        f"Xid {XID} on GPU {UNHEALTHY_GPU} in the kernel log: the plugin marks it unhealthy",
        inject_unhealthy_device,
    ),
    Scenario(
        "row-remap-pending",
        f"GPU {UNHEALTHY_GPU} has row remaps pending: DCGM's software test fails on it, the "
        "device plugin still advertises it",
        inject_row_remap_pending,
    ),
    Scenario(
        "driver-library-mismatch",
        "the loaded module differs from the driver library: NVML fails to initialise",
        inject_driver_mismatch,
    ),
    Scenario(
        "mig-mode-needs-reboot",
        "a MIG mode change on the node needs a reboot: the MIG manager reboots it for real",
        inject_mig_mode_needs_reboot,
    ),
    Scenario(
        "mig-manager-failed",
        "the MIG manager fails every layout that changes the GPUs, leaving them as they were",
        inject_mig_manager_failed,
    ),
)


def find_scenario(name: str) -> Scenario:
    """The scenario called `name`; bad input naming the known ones otherwise."""
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    known = ", ".join(s.name for s in SCENARIOS)
    raise BadInput(f"unknown scenario {name!r}; known: {known}")


# --------------------------------------------------------------- break / heal


@contextmanager
def open_lab(lab_dir: Path) -> Iterator[LabAccess]:
    """The lab in lab_dir with a client on its API."""
    lab = Lab.from_lab_dir(lab_dir.resolve())
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as kube:
        yield LabAccess(lab, kube)


def read_record(lab: Lab) -> list[dict[str, Any]]:
    """The breakages recorded in the lab directory, oldest first."""
    path = lab.lab_dir / RECORD_FILE
    if not path.exists():
        return []
    entries: list[dict[str, Any]] = json.loads(path.read_text())["broken"]
    return entries


def _write_record(lab: Lab, entries: list[dict[str, Any]]) -> None:
    path = lab.lab_dir / RECORD_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"broken": entries}, indent=1) + "\n")
    tmp.chmod(0o600)
    tmp.rename(path)


def choose_node(lab: Lab, scenario: Scenario, name: str | None) -> NodeSpec:
    """The named node (checked against the scenario), else the first node that suits it."""
    if name is not None:
        try:
            node = lab.find_node(name)
        except LabFailed as exc:
            raise BadInput(str(exc)) from exc
        if scenario.needs_1x and not node.containerd.startswith("1."):
            raise BadInput(
                f"{scenario.name} needs a containerd 1.x node; {node.name} runs {node.containerd}"
            )
        return node
    for node in lab.nodes:
        if not scenario.needs_1x or node.containerd.startswith("1."):
            return node
    raise BadInput(f"{scenario.name} needs a containerd 1.x node; the lab has none")


def break_lab(access: LabAccess, scenario: Scenario, node: NodeSpec) -> None:
    """Inject `scenario` on `node`, recording how to undo each change before making it."""
    entries = read_record(access.lab)
    for entry in entries:
        if entry["scenario"] == scenario.name and entry["node"] == node.name:
            raise BadInput(f"{scenario.name} is already broken on {node.name}; heal it first")
    undo: list[dict[str, Any]] = []
    entry = {"scenario": scenario.name, "node": node.name, "undo": undo}
    entries.append(entry)
    try:
        scenario.inject(access, node, undo)
    finally:
        # Whatever was done is recorded, even when the injection failed halfway.
        _write_record(access.lab, entries)


def heal_lab(access: LabAccess, node: str | None = None) -> list[dict[str, Any]]:
    """Undo recorded breakages (of one node, or all), newest first; returns those healed."""
    entries = read_record(access.lab)
    healed = [e for e in entries if node is None or e["node"] == node]
    for entry in reversed(healed):
        for action in reversed(entry["undo"]):
            _undo(access, action)
        entries.remove(entry)
        _write_record(access.lab, entries)
    if not entries:
        (access.lab.lab_dir / RECORD_FILE).unlink(missing_ok=True)
    return healed


def _undo(access: LabAccess, action: Mapping[str, Any]) -> None:
    kind = action["kind"]
    if kind == "containerd-tree":
        node = access.lab.find_node(action["node"])
        tar = base64.b64decode(action["tar_b64"])
        access.ssh_check(
            node,
            ["sh", "-c", "find /etc/containerd -mindepth 1 -delete && tar -C / -xpf -"],
            stdin=tar,
        )
        _restart_containerd(access, node, expect_active=True)
    elif kind == "file":
        node = access.lab.find_node(action["node"])
        if action["b64"] is None:
            access.ssh_check(node, ["rm", "-f", action["path"]])
        else:
            _write_node_file(access, node, action["path"], base64.b64decode(action["b64"]))
            access.ssh_check(node, ["chmod", action["mode"], action["path"]])
    elif kind in ("label", "annotation"):
        _patch_node_metadata(access, action["node"], kind, action["key"], action["value"])
    elif kind == "pod":
        access.kube.delete_pod(action["namespace"], action["name"], 0, missing_ok=True)
    elif kind == "delete":
        access.api("DELETE", action["path"])
    elif kind == "device-plugin-config":
        # A merge patch merges objects: clear the config, then put the old one back whole.
        clear = {"spec": {"devicePlugin": {"config": None}}}
        access.kube.patch_cluster_policy(CLUSTER_POLICY_NAME, clear)
        if action["config"] is not None:
            restore = {"spec": {"devicePlugin": {"config": action["config"]}}}
            access.kube.patch_cluster_policy(CLUSTER_POLICY_NAME, restore)
        _wait_plugin_rollout(access, str((action["config"] or {}).get("name") or ""))
    elif kind == "configmap-data":
        current = access.kube.get_configmap(action["namespace"], action["name"])
        access.kube.replace_configmap(current.with_data(action["data"]))
    else:
        raise ScenarioFailed(f"{RECORD_FILE}: unknown undo action {kind!r}")


def _wait_plugin_rollout(access: LabAccess, config_name: str) -> None:
    """Wait until the device plugin DaemonSet runs `config_name` on every node, all ready:
    a ClusterPolicy change restarts the plugin pods one node at a time."""
    path = f"/apis/apps/v1/namespaces/{OPERATOR_NAMESPACE}/daemonsets/{DEVICE_PLUGIN.name}"

    def rolled_out() -> bool:
        daemonset = access.api("GET", path)
        containers = daemonset["spec"]["template"]["spec"]["containers"]
        env = {e.get("name"): e.get("value") for c in containers for e in c.get("env") or []}
        status = daemonset.get("status") or {}
        desired = status.get("desiredNumberScheduled")
        return (
            env.get(CONFIG_NAME_ENV, "") == config_name
            and status.get("observedGeneration") == daemonset["metadata"].get("generation")
            and status.get("updatedNumberScheduled") == desired
            and status.get("numberReady") == desired
        )

    _wait(f"the device plugin to run config {config_name or '(none)'} on every node", rolled_out)


def _wait(what: str, probe: Callable[[], bool], timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(POLL_S)
