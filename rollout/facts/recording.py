"""`rollout facts record`: write facts in the layout rollout.facts.recorded reads.

What is written is exactly what `plan --facts` and `diagnose --facts` read back: node.yaml
(the raw texts of the facts whose parsers recorded facts reuse: `containerd --version`,
`systemctl show`, the kernel log's Xid lines, `nvidia-smi -L` with its exit code), the
node's files under files/, and cluster.yaml. Secrets are redacted here, before anything
reaches the disk (rollout.secrets): registry credentials in the CRI config and hosts.toml
headers become `<redacted>`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rollout.errors import BadInput
from rollout.facts.model import FleetFacts, NodeFacts
from rollout.facts.pods import GPU_RESOURCE
from rollout.facts.recorded import CLUSTER_FILE, FILES_DIR, NODE_FILE
from rollout.facts.rowremap import remapped_rows_text
from rollout.facts.service import ServiceState
from rollout.secrets import redact_toml
from rollout.transports.kube import ContainerStatus, Pod, plain


def record_fleet(fleet: FleetFacts, directory: Path) -> list[Path]:
    """Write every node's facts and the cluster's into `directory`; the files written."""
    if directory.exists() and any(directory.iterdir()):
        raise BadInput(f"{directory}: not empty; record into a new directory")
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    written: list[Path] = []
    for node in fleet.nodes:
        written += _record_node(node, directory / node.name)
    written.append(_write(directory / CLUSTER_FILE, _cluster_document(fleet)))
    return written


def node_document(node: NodeFacts) -> dict[str, Any]:
    """node.yaml of one node: what recorded.NodeRecord reads."""
    doc: dict[str, Any] = {
        "name": node.name,
        "containerd_version": node.containerd.raw,
        "containerd_config": node.config_files.main_path,
        "labels": dict(node.labels),
        "annotations": dict(node.annotations),
        "unschedulable": node.unschedulable,
        "ready": node.ready,
        "gpus": {
            "count": node.gpus.count,
            "product": node.gpus.product,
            "driver_version": node.gpus.driver_version,
            "uuids": list(node.gpus.uuids),
        }
        | ({} if node.gpus.device_ids is None else {"device_ids": list(node.gpus.device_ids)}),
        "capacity": dict(node.capacity),
        "allocatable": dict(node.allocatable),
        "taints": list(node.taints),
        "kernel_log": "".join(f"{x.line}\n" for x in node.xids),
        "service_journal": "".join(f"{line}\n" for line in node.service_journal),
        "config_mtimes": dict(node.config_mtimes),
        "pods": [pod_manifest(p) for p in node.pods],
        "pod_logs": dict(node.pod_logs),
    }
    if node.service is not None:
        doc["service"] = service_text(node.service)
    if node.remapped_rows:
        doc["remapped_rows"] = remapped_rows_text(node.remapped_rows)
    if node.driver_kernel is not None:
        kernel = node.driver_kernel
        doc["driver_kernel"] = (
            f"{kernel.kernel}\n---\n"
            + (
                f"NVRM version: NVIDIA UNIX Kernel Module  {kernel.loaded}\n"
                if kernel.loaded
                else ""
            )
            + "---\n"
            + (f"{kernel.installed}\n" if kernel.installed else "")
        )
    if node.driver_host is not None:
        doc["driver_host"] = dict(node.driver_host.raw)
    if node.driver_status is not None:
        status = node.driver_status
        doc["nvidia_smi"] = "".join(f"{line}\n" for line in status.output) + (
            f"rollout-exit={status.exit_code}\n"
        )
    return doc


def pod_manifest(pod: Pod) -> dict[str, Any]:
    """A manifest the transport's Pod.from_json reads back as `pod`."""
    metadata: dict[str, Any] = {
        "namespace": pod.namespace,
        "name": pod.name,
        "uid": pod.uid,
        "resourceVersion": pod.resource_version,
        "labels": dict(pod.labels),
        "annotations": dict(pod.annotations),
        "ownerReferences": [
            {"kind": o.kind, "name": o.name, "controller": o.controller} for o in pod.owners
        ],
    }
    if pod.deleting:
        metadata["deletionTimestamp"] = "1970-01-01T00:00:00Z"
    containers: list[dict[str, Any]] = [{"name": name} for name in pod.containers]
    if pod.gpu_request:
        gpus = {"limits": {GPU_RESOURCE: str(pod.gpu_request)}}
        if containers:
            containers[0]["resources"] = gpus
        else:
            containers = [{"name": "", "resources": gpus}]
    spec: dict[str, Any] = {"containers": containers}
    if pod.node_name:
        spec["nodeName"] = pod.node_name
    if pod.uses_empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    status: dict[str, Any] = {
        "phase": pod.phase,
        "conditions": [{"type": "Ready", "status": "True" if pod.ready else "False"}],
        "containerStatuses": [
            {"state": {"waiting": {"reason": r}}}
            for r in pod.container_reasons
            # `Init:<reason>` is read from the init container statuses, recorded below
            if not (pod.init_statuses and r.startswith("Init:"))
        ],
    }
    if pod.init_statuses:
        status["initContainerStatuses"] = [container_status(s) for s in pod.init_statuses]
    if pod.reason:
        status["reason"] = pod.reason
    if pod.message:
        status["message"] = pod.message
    return {"metadata": metadata, "spec": spec, "status": status}


def container_status(status: ContainerStatus) -> dict[str, Any]:
    """A containerStatuses entry that ContainerStatus.from_json reads back as `status`."""
    state: dict[str, Any] = {}
    if status.reason:
        state["reason"] = status.reason
    if status.exit_code is not None:
        state["exitCode"] = status.exit_code
    return {
        "name": status.name,
        "ready": status.ready,
        "restartCount": status.restart_count,
        "state": {status.state: state},
    }


def service_text(state: ServiceState) -> str:
    """`systemctl show` text that parse_service_show reads back as `state`."""
    since = (
        state.active_enter_at.strftime("%a %Y-%m-%d %H:%M:%S.%f UTC")
        if state.active_enter_at
        else "n/a"
    )
    return (
        f"MainPID={state.main_pid}\nActiveState={state.active_state}\n"
        f"SubState={state.sub_state}\nNRestarts="
        f"{'' if state.n_restarts is None else state.n_restarts}\n"
        f"ActiveEnterTimestamp={since}\nInvocationID={state.invocation_id}\n"
    )


def _record_node(node: NodeFacts, node_dir: Path) -> list[Path]:
    written = [_write(node_dir / NODE_FILE, node_document(node))]
    for path, text in node.config_files.files.items():
        local = node_dir / FILES_DIR / path.lstrip("/")
        if not local.resolve().is_relative_to((node_dir / FILES_DIR).resolve()):
            raise BadInput(f"{node.name}: a file path leaves the node's directory: {path!r}")
        local.parent.mkdir(parents=True, exist_ok=True)
        body = redact_toml(text) if path.endswith(".toml") else text
        local.write_text(body, encoding="utf-8")
        written.append(local)
    return written


def _cluster_document(fleet: FleetFacts) -> dict[str, Any]:
    cluster = fleet.cluster
    doc: dict[str, Any] = {
        "configmaps": {k: dict(v) for k, v in cluster.configmaps.items()},
        "cluster_policy": plain(cluster.cluster_policy),
        "pods": [p.to_manifest() for p in cluster.pods],
        "pod_events": {k: list(v) for k, v in cluster.pod_events.items()},
    }
    if cluster.nvidia_drivers:
        doc["nvidia_drivers"] = plain(cluster.nvidia_drivers)
    if cluster.runtime_classes is not None:
        doc["runtime_classes"] = dict(cluster.runtime_classes)
    if cluster.daemonsets is not None:
        doc["daemonsets"] = [d.to_manifest() for d in cluster.daemonsets]
    if cluster.failed_creates:
        doc["failed_creates"] = {k: list(v) for k, v in cluster.failed_creates.items()}
    return doc


def _write(path: Path, document: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
    return path
