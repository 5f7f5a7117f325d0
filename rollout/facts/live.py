"""Live facts: each node probed over SSH (the fact objects) and the Kubernetes API.

The result has the same shape as recorded facts (rollout.facts.recorded), so the planner
never knows whether it plans from a directory or from the cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from rollout.changes import cluster_reads, node_files, reads_nvidia_drivers
from rollout.closeable import Closeable
from rollout.commands import CommandRunner
from rollout.containerd import ConfigFiles, ContainerdVersion
from rollout.containerd.files import DEFAULT_MAIN_PATH
from rollout.driver.operatorlive import read_nvidia_drivers
from rollout.driver.status import DriverKernelFact, DriverStatusFact
from rollout.errors import RolloutError
from rollout.fact import ProbeFailed, read_fact
from rollout.facts.batch import read_facts
from rollout.facts.containerd import (
    ConfigDumpFact,
    ConfigFilesFact,
    ConfigMtimesFact,
    ContainerdVersionFact,
)
from rollout.facts.daemonsets import DaemonSetFacts
from rollout.facts.extra import with_plan_facts
from rollout.facts.gpu import GpuFacts, GpuQueryFact
from rollout.facts.gpu_operator import (
    DevicePluginConfigRef,
    is_operand,
)
from rollout.facts.kernel import KernelXidFact
from rollout.facts.migmanager import with_mig_manager
from rollout.facts.model import ClusterFacts, FleetFacts, NodeFacts
from rollout.facts.pods import PodFacts, Toleration, is_gpu_refusal, pod_facts_from
from rollout.facts.progress import GatherProgress
from rollout.facts.rowremap import RemappedRowsFact
from rollout.facts.service import ServiceFact, ServiceJournalFact, ServiceState
from rollout.operatornames import OPERATOR_NAMESPACE
from rollout.retry import retry_transient
from rollout.spec import Spec
from rollout.transports.errors import Forbidden, NotFound
from rollout.transports.fanout import run_on_nodes
from rollout.transports.kube import KubeClient, Node, Pod


@dataclass(frozen=True)
class NodeProbe:
    """What SSH tells about one node."""

    containerd: ContainerdVersion
    config_files: ConfigFiles
    gpus: GpuFacts
    service: ServiceState
    effective_config: Mapping[str, Any]


def probe_node(
    runner: CommandRunner, main_path: str = DEFAULT_MAIN_PATH, also: tuple[str, ...] = ()
) -> NodeProbe:
    """Every node fact over one runner in one round trip: containerd, its files (and the files
    `also` names, wherever they lie) and dump, its service, the GPUs (each fact's own command
    and parser, rollout.facts.batch)."""
    containerd, files, gpus, service, dump = read_facts(
        runner,
        (
            ContainerdVersionFact(),
            ConfigFilesFact(main_path, also=also),
            GpuQueryFact(),
            ServiceFact(),
            ConfigDumpFact(main_path),
        ),
    )
    return NodeProbe(
        containerd=containerd,
        config_files=files,
        gpus=gpus,
        service=service,
        effective_config=dump,
    )


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
        pods=tuple(pods),
    )


def gather_cluster_facts(spec: Spec, kube: KubeClient) -> ClusterFacts:
    """The ClusterPolicy spec, the ConfigMaps the plan's change kinds read to plan (each
    kind's `cluster_reads`), and the NVIDIADrivers where the plan names one."""
    policy = read_cluster_policy_spec(kube)
    configmaps: dict[str, Mapping[str, str]] = {}
    for namespace, name in cluster_reads(spec.changes, policy):
        try:
            configmaps[f"{namespace}/{name}"] = dict(kube.get_configmap(namespace, name).data)
        except NotFound:
            continue
    pdbs = tuple(
        f"{b.namespace}/{b.name}: {b.disruptions_allowed} disruption(s) allowed"
        for b in kube.list_pdbs(None)
    )
    return ClusterFacts(
        configmaps=configmaps,
        cluster_policy=policy,
        nvidia_drivers=read_plan_nvidia_drivers(spec, kube),
        pdbs=pdbs,
    )


def read_plan_nvidia_drivers(spec: Spec, kube: KubeClient) -> dict[str, Mapping[str, Any]]:
    """Every NVIDIADriver's spec by name, where a change's kind plans from them (a driver
    change naming one: the plan refuses a name not among them, listing those present); none
    for any other plan."""
    if not reads_nvidia_drivers(spec.changes):
        return {}
    return read_nvidia_drivers(kube)


def read_cluster_policy_spec(kube: KubeClient) -> dict[str, Any]:
    """The spec of the GPU Operator's ClusterPolicy (one per cluster); {} where there is none."""
    policies: Sequence[Mapping[str, Any]] = kube.list_cluster_policies()
    return dict(policies[0].get("spec") or {}) if policies else {}


def gather_fleet_facts(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    kube: KubeClient,
    max_parallel: int = 8,
    source: str = "live",
    progress: GatherProgress | None = None,
    release: bool = False,
) -> FleetFacts:
    """Probe every node in parallel (bounded), telling `progress` of each; a node that fails
    fails the gathering once every node has answered, all failed nodes named together.

    With `release`, each node's connection is closed once its facts are read (a plan uses
    it for nothing else): an idle paramiko connection keeps a thread that wakes ten times a
    second, and a thousand of them starve the nodes still being probed of the GIL.
    """

    api_errors: dict[str, RolloutError] = {}
    # the files the plan writes outside /etc/containerd (a registry's hosts.toml): read in the
    # same round trip
    also = node_files(spec.changes)

    def probe(runner: CommandRunner) -> NodeFacts:
        try:
            ssh = retry_transient(lambda: probe_node(runner, also=also))
        finally:
            if release and isinstance(runner, Closeable):
                runner.close()
        # the node's API reads in its thread too, beside the other nodes' SSH round trips
        name = runner.host
        try:
            bound = kube.list_pods(None, field_selector=f"spec.nodeName={name}")
            node = kube.get_node(name)
        except RolloutError as exc:
            api_errors[name] = exc
            raise
        return node_facts_from(name, ssh, node, bound)

    # the cluster's own reads wait on no node: made meanwhile, in a thread nothing waits for
    # when a node fails (its error is reported at once, as when they came after the nodes)
    cluster: Future[ClusterFacts] = Future()

    def read_cluster() -> None:
        try:
            cluster.set_result(gather_cluster_facts(spec, kube))
        except BaseException as exc:  # raised by cluster.result(), in the caller's thread
            cluster.set_exception(exc)

    threading.Thread(target=read_cluster, name="rollout-cluster", daemon=True).start()

    def tell(name: str, result: NodeFacts | RolloutError) -> None:
        if progress is not None:
            progress.node_done(name, not isinstance(result, RolloutError))

    results = run_on_nodes(list(runners.values()), probe, max_parallel=max_parallel, on_done=tell)
    failures = [
        f"{name}: {res}"
        for name, res in results.items()
        if isinstance(res, RolloutError) and name not in api_errors
    ]
    if failures:
        raise ProbeFailed(
            f"could not gather facts from {len(failures)} of {len(results)} node(s):\n  "
            + "\n  ".join(failures)
        )
    for name in results:
        if name in api_errors:
            raise api_errors[name]  # the API's own error and hint, as the cluster answered
    nodes = [result for result in results.values() if isinstance(result, NodeFacts)]
    nodes = with_plan_facts(spec, runners, nodes, max_parallel)
    return FleetFacts(
        nodes=tuple(sorted(nodes, key=lambda n: n.name)),
        cluster=cluster.result(),
        source=source,
    )


# ---------------------------------------------------------------- diagnosis


def probe_node_tolerantly(
    name: str,
    runner: CommandRunner,
    node: Node,
    pods: Sequence[Pod] = (),
    main_path: str = DEFAULT_MAIN_PATH,
) -> NodeFacts:
    """Every node fact diagnose reads; a fact that cannot be read is named in probe_errors.

    The containerd version and files are required (without them there is nothing to
    diagnose on the node: ProbeFailed); a dump that fails (containerd refusing its config),
    a stopped service or a missing nvidia-smi are findings, not failures.
    """
    errors: dict[str, str] = {}

    def optional(fact: Any, default: Any) -> Any:
        try:
            return retry_transient(lambda: read_fact(runner, fact))
        except RolloutError as exc:
            errors[fact.what] = str(exc)
            return default

    probe = NodeProbe(
        containerd=retry_transient(lambda: read_fact(runner, ContainerdVersionFact())),
        config_files=retry_transient(lambda: read_fact(runner, ConfigFilesFact(main_path))),
        gpus=optional(GpuQueryFact(), GpuFacts(count=0)),
        service=optional(ServiceFact(), None),
        effective_config=optional(ConfigDumpFact(main_path), {}),
    )
    return dataclasses.replace(
        node_facts_from(name, probe, node, pods),
        xids=optional(KernelXidFact(), ()),
        driver_status=optional(DriverStatusFact(), None),
        driver_kernel=optional(DriverKernelFact(), None),
        config_mtimes=optional(ConfigMtimesFact(), {}),
        remapped_rows=optional(RemappedRowsFact(), ()),
        service_journal=optional(ServiceJournalFact(), ()),
        probe_errors=errors,
    )


def gather_diagnosis_facts(
    runners: Mapping[str, CommandRunner],
    kube: KubeClient,
    max_parallel: int = 8,
    source: str = "live",
) -> tuple[FleetFacts, dict[str, str]]:
    """The named nodes' facts for diagnose (the MIG manager's too, where a node asks for a
    layout: rollout.facts.migmanager), and the nodes that could not be probed (why)."""
    api_nodes = {n.name: n for n in kube.list_nodes()}
    missing = {name: "not a node of the cluster" for name in runners if name not in api_nodes}
    pods = kube.list_pods(None)

    def probe(runner: CommandRunner) -> NodeFacts:
        bound = [p for p in pods if p.node_name == runner.host]
        return probe_node_tolerantly(runner.host, runner, api_nodes[runner.host], bound)

    reachable = [r for name, r in runners.items() if name in api_nodes]
    results = run_on_nodes(reachable, probe, max_parallel=max_parallel)
    nodes = [
        dataclasses.replace(r, pod_logs=read_operand_logs(kube, r.pods))
        for r in results.values()
        if isinstance(r, NodeFacts)
    ]
    failed = {name: str(r) for name, r in results.items() if not isinstance(r, NodeFacts)}
    fleet = FleetFacts(
        nodes=tuple(sorted(nodes, key=lambda n: n.name)),
        cluster=gather_diagnosis_cluster(kube, pods),
        source=source,
    )
    return with_mig_manager(kube, fleet), {**missing, **failed}


LOG_TAIL_LINES = 20


def read_operand_logs(kube: KubeClient, pods: Sequence[Pod]) -> dict[str, str]:
    """The log tails of the operator's pods that are not ready; a log that cannot be read
    (a pod of several containers, a container not started) is left out."""
    logs: dict[str, str] = {}
    for pod in pods:
        if not is_operand(pod) or pod.ready:
            continue
        try:
            logs[f"{pod.namespace}/{pod.name}"] = kube.read_pod_log(
                pod.namespace, pod.name, tail_lines=LOG_TAIL_LINES
            )
        except RolloutError:
            continue
    return logs


def gather_diagnosis_cluster(kube: KubeClient, pods: Sequence[Pod]) -> ClusterFacts:
    """The ClusterPolicy, the device-plugin ConfigMap it names, the RuntimeClasses, every pod
    with its spec, and the events of the GPU pods waiting for a node."""
    policy = read_cluster_policy_spec(kube)
    configmaps: dict[str, Mapping[str, str]] = {}
    config = DevicePluginConfigRef.from_policy(policy)
    if config.name:
        with contextlib.suppress(NotFound):  # the profile check then says nothing
            configmaps[config.configmap] = dict(
                kube.get_configmap(OPERATOR_NAMESPACE, config.name).data
            )
    facts = tuple(pod_facts_from(p) for p in pods)
    return ClusterFacts(
        configmaps=configmaps,
        cluster_policy=policy,
        runtime_classes=read_runtime_classes(kube),
        pods=facts,
        pod_events=read_pending_pod_events(kube, facts),
        daemonsets=read_operand_daemonsets(kube),
        failed_creates=read_failed_creates(kube),
    )


def read_failed_creates(kube: KubeClient) -> dict[str, tuple[str, ...]]:
    """What controllers could not create because the API refused a GPU pod ("Kind ns/name" ->
    event lines): a pod the API refuses never exists, its controller's FailedCreate events are
    all that is left of it. Events the API will not list say nothing."""
    try:
        found = kube.list_events(None, field_selector="reason=FailedCreate")
    except Forbidden:
        return {}
    refused: dict[str, tuple[str, ...]] = {}
    for event in found:
        if is_gpu_refusal(event.message):
            key = f"{event.involved_kind} {event.namespace}/{event.involved_name}"
            refused[key] = (*refused.get(key, ()), event.describe())
    return refused


def read_operand_daemonsets(kube: KubeClient) -> tuple[DaemonSetFacts, ...] | None:
    """The GPU Operator's DaemonSets; None (not judged) where the API will not list them."""
    try:
        found = kube.list_daemonsets(OPERATOR_NAMESPACE)
    except (Forbidden, NotFound):  # no RBAC for apps/daemonsets in the operator's namespace
        return None
    return tuple(
        DaemonSetFacts(
            namespace=d.namespace,
            name=d.name,
            node_selector=dict(d.node_selector),
            tolerations=tuple(Toleration.from_api(t) for t in d.tolerations),
            desired=d.desired,
            ready=d.ready,
        )
        for d in found
    )


def read_runtime_classes(kube: KubeClient) -> dict[str, str] | None:
    """RuntimeClass name -> handler; None (not judged) where the API will not list them."""
    try:
        return {c.name: c.handler for c in kube.list_runtime_classes()}
    except (Forbidden, NotFound):  # no RBAC for node.k8s.io, or no such API group
        return None


def read_pending_pod_events(
    kube: KubeClient, pods: Sequence[PodFacts]
) -> dict[str, tuple[str, ...]]:
    """The events of each GPU pod that waits for a node ("namespace/name" -> lines, oldest
    first), the scheduler's FailedScheduling among them; pods that cannot be read say nothing."""
    events: dict[str, tuple[str, ...]] = {}
    for pod in pods:
        if not (pod.wants_gpu and pod.phase == "Pending" and not pod.node_name):
            continue
        selector = f"involvedObject.kind=Pod,involvedObject.name={pod.name}"
        try:
            found = kube.list_events(pod.namespace, field_selector=selector)
        except Forbidden:
            continue
        if found:
            events[pod.key] = tuple(e.describe() for e in found)
    return events
