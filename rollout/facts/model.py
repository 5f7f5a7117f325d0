"""What the planner knows about the fleet: one shape for recorded and live facts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.containerd import ConfigFiles, ContainerdConfigError, ContainerdVersion
from rollout.driver.host import DriverHost
from rollout.driver.status import DriverKernel, DriverStatus
from rollout.errors import InputError, SourceLocation
from rollout.facts.daemonsets import DaemonSetFacts
from rollout.facts.gpu import GpuFacts
from rollout.facts.kernel import XidEvent
from rollout.facts.pods import PodFacts
from rollout.facts.rowremap import RemappedRows
from rollout.facts.service import ServiceState
from rollout.transports.kube import Pod


@dataclass(frozen=True)
class NodeFacts:
    """Everything the planner needs to know about one node."""

    name: str
    containerd: ContainerdVersion
    config_files: ConfigFiles
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    ready: bool = True
    gpus: GpuFacts = field(default_factory=lambda: GpuFacts(count=0))
    # Live facts only (recorded facts leave them empty):
    taints: tuple[str, ...] = ()
    capacity: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    # containerd.service as `systemctl show` reported it
    service: ServiceState | None = None
    # the node's own `containerd config dump` of its files now (without `imports`)
    effective_config: Mapping[str, Any] = field(default_factory=dict)
    # the pods bound to the node, as the API transport reads them (rollout.drain classifies them)
    pods: tuple[Pod, ...] = ()
    # Recorded facts only: the node's directory in the facts directory (`facts/gpu-1`).
    recorded_at: str = ""
    # What diagnose reads besides (live, or recorded by `rollout facts record`):
    # the kernel log's Xid lines, `nvidia-smi -L` with its exit code, file mtimes under
    # /etc/containerd (seconds since the epoch), and the facts that could not be read.
    xids: tuple[XidEvent, ...] = ()
    driver_status: DriverStatus | None = None
    # `uname -r`, the nvidia module loaded and the one installed for the kernel (raw text kept
    # for recording: rollout.driver.status.parse_driver_kernel reads it)
    driver_kernel: DriverKernel | None = None
    config_mtimes: Mapping[str, float] = field(default_factory=dict)
    # each GPU's pending and failed row remaps (`nvidia-smi --query-remapped-rows`)
    remapped_rows: tuple[RemappedRows, ...] = ()
    # a `mode: host` driver upgrade's facts: nvidia-smi, packages, apt, Secure Boot, modules
    driver_host: DriverHost | None = None
    # containerd's journal: restarts, SIGHUPs and failures (rollout.facts.service)
    service_journal: tuple[str, ...] = ()
    # the log tails of the GPU Operator's pods on the node that are not ready ("ns/name" -> text)
    pod_logs: Mapping[str, str] = field(default_factory=dict)
    probe_errors: Mapping[str, str] = field(default_factory=dict)

    def source_of(self, path: str) -> str:
        """Where the content of a node file was read: its recorded copy, or `node:path`."""
        if self.recorded_at:
            return f"{self.recorded_at}/files{path}"
        return f"{self.name}:{path}"

    def config_error(self, exc: ContainerdConfigError) -> NodeFactsError:
        """An engine error about this node's own config files, naming the node and the file."""
        path = exc.path or self.config_files.main_path
        return NodeFactsError(
            self.name,
            SourceLocation(self.source_of(path), exc.line, exc.column),
            f"{path}: {exc.detail}",
        )

    @property
    def available(self) -> bool:
        """Counts toward max_unavailable when false: cordoned or NotReady."""
        return self.ready and not self.unschedulable


class NodeFactsError(InputError):
    """One problem in one node's facts: names the file it was read from and the node."""

    def __init__(
        self,
        node: str,
        location: SourceLocation,
        message: str,
        *,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.node = node
        self.subject = f"node {node}: "
        super().__init__(location, message, field=field, hint=hint)


@dataclass(frozen=True)
class ClusterFacts:
    """Cluster-wide objects the plan touches: ConfigMaps by namespace/name, the ClusterPolicy,
    NVIDIADrivers."""

    configmaps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    cluster_policy: Mapping[str, Any] = field(default_factory=dict)
    # NVIDIADriver resources by name, each its spec (read for a plan that names one)
    nvidia_drivers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # PodDisruptionBudgets as "namespace/name: N disruption(s) allowed"
    pdbs: tuple[str, ...] = ()
    # For diagnose: RuntimeClass name -> handler (None: not known), and the pods as manifests
    # (rollout.facts.pods) with their events, "namespace/name" -> messages.
    runtime_classes: Mapping[str, str] | None = None
    pods: tuple[PodFacts, ...] = ()
    pod_events: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the GPU Operator's DaemonSets (None: not known): where each operand's pods should run
    daemonsets: tuple[DaemonSetFacts, ...] | None = None
    # controllers whose GPU pods the API refused ("ReplicaSet ns/name" -> FailedCreate lines)
    failed_creates: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetFacts:
    nodes: tuple[NodeFacts, ...]
    cluster: ClusterFacts
    source: str

    def by_name(self, name: str) -> NodeFacts | None:
        return next((n for n in self.nodes if n.name == name), None)
