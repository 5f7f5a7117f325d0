"""Live facts: probes over SSH and the Kubernetes API, each a command plus a pure parser.

The result has the same shape as recorded facts (rollout.facts), so the planner never knows
whether it plans from a directory or from the cluster.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout.commands import CommandRunner, check
from rollout.containerd import ConfigFiles, ContainerdVersion, parse_version
from rollout.errors import RolloutError
from rollout.facts import DEFAULT_CONTAINERD_CONFIG, ClusterFacts, FleetFacts, GpuFacts, NodeFacts
from rollout.retry import retry_transient
from rollout.spec import Spec, TimeSlicingChange
from rollout.transports.errors import NotFound
from rollout.transports.fanout import run_on_nodes
from rollout.transports.kube import KubeClient, Node, Pod

CONTAINERD_DIR = "/etc/containerd"
# Config files are small; anything bigger under /etc/containerd (a stray image, a core dump)
# is not configuration and is not read.
MAX_FILE_BYTES = 1_000_000
_GPU_LINE = re.compile(
    r"^\s*(?P<uuid>GPU-[0-9a-fA-F-]+)\s*,\s*(?P<name>[^,]+?)\s*,\s*(?P<driver>[^,\s]+)\s*$"
)


class ProbeFailed(RolloutError):
    """A node could not be probed; the message names the node and the probe."""


SERVICE_PROPERTIES = ("MainPID", "ActiveState", "NRestarts", "Restart", "RestartUSec")


@dataclass(frozen=True)
class NodeProbe:
    """What SSH tells about one node."""

    containerd: ContainerdVersion
    config_files: ConfigFiles
    gpus: GpuFacts
    service: Mapping[str, str]
    effective_config: Mapping[str, Any]


def probe_node(runner: CommandRunner, main_path: str = DEFAULT_CONTAINERD_CONFIG) -> NodeProbe:
    """containerd version, every file under /etc/containerd, and the GPUs, over one runner."""
    version = parse_version(
        check(runner.run(["containerd", "--version"]), "read the containerd version").stdout
    )
    dumped = check(runner.run(file_dump_argv(CONTAINERD_DIR)), f"read {CONTAINERD_DIR}").stdout
    files = parse_file_dump(dumped)
    if main_path not in files:
        raise ProbeFailed(f"{runner.host}: {main_path} not found; is containerd configured there?")
    smi = runner.run(
        ["nvidia-smi", "--query-gpu=uuid,name,driver_version", "--format=csv,noheader"]
    )
    gpus = parse_gpu_query(smi.stdout) if smi.ok else GpuFacts(count=0)
    show = ["systemctl", "show", "containerd", *(f"--property={p}" for p in SERVICE_PROPERTIES)]
    service = parse_properties(check(runner.run(show), "read containerd.service").stdout)
    dump = check(runner.run(["containerd", "config", "dump"]), "read containerd's config dump")
    try:
        effective = tomllib.loads(dump.stdout)
    except tomllib.TOMLDecodeError as exc:
        raise ProbeFailed(f"{runner.host}: `containerd config dump` is not TOML: {exc}") from exc
    files_now = ConfigFiles(main_path=main_path, files=files)
    return NodeProbe(version, files_now, gpus, service, effective)


def parse_properties(text: str) -> dict[str, str]:
    """`systemctl show` output (Key=Value lines) -> {Key: Value}."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def file_dump_argv(directory: str) -> list[str]:
    """Every regular file under a directory in one round trip: path NUL content NUL, ..."""
    # Config files hold no NUL, so splitting on it is exact.
    script = 'for f do printf "%s\\0" "$f"; cat -- "$f"; printf "\\0"; done'
    size = f"-{MAX_FILE_BYTES}c"
    return [
        "find",
        directory,
        "-type",
        "f",
        "-size",
        size,
        "-exec",
        "sh",
        "-c",
        script,
        "sh",
        "{}",
        "+",
    ]


def parse_file_dump(text: str) -> dict[str, str]:
    """`path NUL content NUL ...` (the file probe's output) -> {path: content}."""
    parts = text.split("\0")
    if parts and parts[-1] == "":
        parts.pop()
    if len(parts) % 2:
        raise ProbeFailed(f"file listing ends inside a record ({len(parts)} fields)")
    return dict(sorted(zip(parts[0::2], parts[1::2], strict=True)))


def parse_gpu_query(text: str) -> GpuFacts:
    """`nvidia-smi --query-gpu=uuid,name,driver_version --format=csv,noheader` -> GpuFacts."""
    rows = [m for m in (_GPU_LINE.match(line) for line in text.splitlines()) if m]
    return GpuFacts(
        count=len(rows),
        product=rows[0]["name"] if rows else "",
        uuids=tuple(m["uuid"] for m in rows),
        driver_version=rows[0]["driver"] if rows else "",
    )


def pod_to_drain_json(pod: Pod) -> dict[str, Any]:
    """The fields of a pod rollout.drain's rules read, in the API's JSON shape."""
    metadata: dict[str, Any] = {
        "namespace": pod.namespace,
        "name": pod.name,
        "labels": dict(pod.labels),
        "annotations": dict(pod.annotations),
        "ownerReferences": [
            {"kind": o.kind, "name": o.name, "controller": o.controller} for o in pod.owners
        ],
    }
    spec: dict[str, Any] = {"nodeName": pod.node_name}
    if pod.uses_empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    # not read by the drain rules: shown in plans (what a drain takes off the GPUs)
    spec["gpuRequest"] = pod.gpu_request
    return {"metadata": metadata, "spec": spec, "status": {"phase": pod.phase}}


def node_facts_from(name: str, probe: NodeProbe, node: Node, pods: Sequence[Pod] = ()) -> NodeFacts:
    """Join what SSH and the API say about one node."""
    return NodeFacts(
        name=name,
        containerd=probe.containerd,
        config_files=probe.config_files,
        labels=dict(node.labels),
        annotations=dict(node.annotations),
        unschedulable=bool(node.unschedulable),
        ready=bool(node.ready),
        gpus=probe.gpus,
        taints=tuple(
            f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
            for t in node.taints
        ),
        capacity=dict(node.capacity),
        allocatable=dict(node.allocatable),
        service=probe.service,
        effective_config=probe.effective_config,
        pods=tuple(pod_to_drain_json(p) for p in pods),
    )


def gather_cluster_facts(spec: Spec, kube: KubeClient) -> ClusterFacts:
    """The ConfigMaps the plan's time-slicing changes touch, and the ClusterPolicy spec."""
    configmaps: dict[str, Mapping[str, str]] = {}
    for change in spec.changes_of(TimeSlicingChange):
        ref = change.configmap
        try:
            configmaps[f"{ref.namespace}/{ref.name}"] = dict(
                kube.get_configmap(ref.namespace, ref.name).data
            )
        except NotFound:
            continue
    policies: Sequence[Mapping[str, Any]] = kube.list_cluster_policies()
    policy = dict(policies[0].get("spec") or {}) if policies else {}
    pdbs = tuple(
        f"{b.namespace}/{b.name}: {b.disruptions_allowed} disruption(s) allowed"
        for b in kube.list_pdbs(None)
    )
    return ClusterFacts(configmaps=configmaps, cluster_policy=policy, pdbs=pdbs)


def gather_fleet_facts(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    kube: KubeClient,
    max_parallel: int = 8,
    source: str = "live",
) -> FleetFacts:
    """Probe every node in parallel (bounded); one failed node fails the gathering, named."""

    def probe(runner: CommandRunner) -> NodeProbe:
        return retry_transient(lambda: probe_node(runner))

    results = run_on_nodes(list(runners.values()), probe, max_parallel=max_parallel)
    failures = [f"{name}: {res}" for name, res in results.items() if isinstance(res, RolloutError)]
    if failures:
        raise ProbeFailed("could not gather facts from every node:\n  " + "\n  ".join(failures))
    nodes = []
    for name, result in results.items():
        assert isinstance(result, NodeProbe)
        bound = kube.list_pods(None, field_selector=f"spec.nodeName={name}")
        nodes.append(node_facts_from(name, result, kube.get_node(name), bound))
    return FleetFacts(
        nodes=tuple(sorted(nodes, key=lambda n: n.name)),
        cluster=gather_cluster_facts(spec, kube),
        source=source,
    )
