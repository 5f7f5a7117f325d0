"""The symptom tree walked over the facts: every branch's checks, the verdict, the order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rollout.diagnose.advertising import check_advertising
from rollout.diagnose.finding import Branch, Finding, Severity, order_findings
from rollout.diagnose.health import check_health
from rollout.diagnose.operator import check_operator
from rollout.diagnose.pods import check_failed_creates, check_pods, check_runtime_classes
from rollout.diagnose.readings import q
from rollout.diagnose.runtime import check_runtime
from rollout.errors import BadInput
from rollout.facts import FleetFacts

# raised when a key of the JSON changes meaning or goes (a new key is no change);
# docs/diagnose.md lists each version
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Diagnosis:
    """The nodes checked and what was found, errors first."""

    nodes: tuple[str, ...]
    findings: tuple[Finding, ...]

    @property
    def healthy(self) -> bool:
        return not any(f.severity is Severity.ERROR for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "healthy": self.healthy,
            "nodes": list(self.nodes),
            "findings": [f.to_json() for f in self.findings],
        }


def diagnose(
    fleet: FleetFacts,
    now: datetime,
    nodes: Sequence[str] = (),
    pod: str | None = None,
    unreachable: Mapping[str, str] | None = None,
) -> Diagnosis:
    """Walk every branch for the named nodes (all when none), and for one pod if named.

    Nodes are judged on their own facts only, so a broken node never makes a healthy
    neighbour report an error. A pod's findings name the node it is bound to, if any.
    """
    unknown = [n for n in nodes if fleet.by_name(n) is None and n not in (unreachable or {})]
    if unknown:
        raise BadInput(
            f"no facts for node(s) {', '.join(unknown)}; known: "
            + ", ".join(n.name for n in fleet.nodes)
        )
    pods = fleet.cluster.pods
    if pod is not None:
        chosen = [p for p in pods if p.key == pod]
        if not chosen:
            raise BadInput(f"no pod {pod} in the facts (pass --pod NAMESPACE/NAME)")
        pods = tuple(chosen)
    checked = [n for n in fleet.nodes if not nodes or n.name in nodes]
    if pod is not None and not nodes:
        bound = chosen[0].node_name
        checked = [n for n in fleet.nodes if n.name == bound]
    findings: list[Finding] = []
    for node in checked:
        findings += check_runtime(node, fleet.cluster)
        findings += check_operator(node, fleet.cluster, now)
        findings += check_advertising(node, fleet.cluster)
        findings += check_health(node)
    for name, why in (unreachable or {}).items():
        if not nodes or name in nodes:
            findings.append(
                Finding(
                    name,
                    None,
                    Branch.RUNTIME,
                    "node.unreachable",
                    f"{name} could not be probed: {why.splitlines()[0] if why else 'no answer'}",
                    tuple(why.splitlines()[:5]),
                    f"ssh {q(name)} true",
                    Severity.ERROR,
                )
            )
    names = {n.name for n in checked}
    scoped = [
        p for p in pods if pod is not None or not nodes or p.node_name in names or not p.node_name
    ]
    findings += check_pods(scoped, fleet.nodes, fleet.cluster)
    if not nodes or pod is not None:
        findings += check_runtime_classes(fleet.cluster)
    # a refused GPU pod has no node and no pod object: said whatever the question
    findings += check_failed_creates(fleet.cluster)
    checked_names = [n.name for n in checked] + [
        n for n in (unreachable or {}) if not nodes or n in nodes
    ]
    return Diagnosis(tuple(checked_names), order_findings(findings))
