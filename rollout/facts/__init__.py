"""Facts about the fleet: one object per fact, the command it runs and a pure parser.

Facts come from two places with one shape: recorded (a directory, `rollout plan --facts`;
rollout.facts.recorded) and live (probed over SSH and the Kubernetes API;
rollout.facts.live). The steps read the same fact objects for their drift checks and
verifications, through `read_fact`; nothing else runs these commands.

- the frame, rollout.fact (re-exported here): `Fact` (command + parse), `read_fact(runner,
  fact)`, `ProbeFailed`; `CommandFact` and `ShellFact`, the frame the facts are written in (a
  sentence, a command, a parser).
- containerd: `ContainerdVersionFact`, `ConfigFilesFact` (/etc/containerd, find + cat),
  `ConfigDumpFact` (the real `config dump`, run from /), `check_containerd_version(planned,
  found)` (the one drift check of the containerd release).
- service: `ServiceFact` (`systemctl show containerd`) -> `ServiceState`.
- gpu: `GpuQueryFact` (nvidia-smi) -> `GpuFacts`.
- model: `NodeFacts`, `ClusterFacts`, `FleetFacts`; recorded: `load_recorded_facts(dir)`.
- for diagnose: kernel `KernelXidFact` (Xid lines), the driver engine's `DriverStatusFact`
  (rollout.driver.status: `nvidia-smi -L` with its exit code), rowremap `RemappedRowsFact`
  (`nvidia-smi --query-remapped-rows`), containerd `ConfigMtimesFact`, pods `PodFacts`
  (`parse_pod_manifest`); live `gather_diagnosis_facts` (a fact that cannot be read is named,
  not fatal); recording `record_fleet(fleet, dir)` (`rollout facts record`).
"""

from rollout.fact import Fact, ProbeFailed, read_fact
from rollout.facts.containerd import (
    CONTAINERD_BIN,
    ConfigDumpFact,
    ConfigFilesFact,
    ContainerdChanged,
    ContainerdVersionFact,
    check_containerd_version,
    parse_file_dump,
)
from rollout.facts.gpu import GpuFacts, GpuQueryFact, parse_gpu_query
from rollout.facts.model import ClusterFacts, FleetFacts, NodeFacts
from rollout.facts.recorded import load_recorded_facts
from rollout.facts.recorded_cluster import load_cluster_facts
from rollout.facts.service import (
    ServiceFact,
    ServiceProbeFailed,
    ServiceState,
    parse_service_show,
    parse_systemd_timestamp,
)

__all__ = [
    "CONTAINERD_BIN",
    "ClusterFacts",
    "ConfigDumpFact",
    "ConfigFilesFact",
    "ContainerdChanged",
    "ContainerdVersionFact",
    "Fact",
    "FleetFacts",
    "GpuFacts",
    "GpuQueryFact",
    "NodeFacts",
    "ProbeFailed",
    "ServiceFact",
    "ServiceProbeFailed",
    "ServiceState",
    "check_containerd_version",
    "load_cluster_facts",
    "load_recorded_facts",
    "parse_file_dump",
    "parse_gpu_query",
    "parse_service_show",
    "parse_systemd_timestamp",
    "read_fact",
]
