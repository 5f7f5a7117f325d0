"""`rollout diagnose`: the seed guide's symptom tree as pure checks over facts.

Each branch is a module of checks that read NodeFacts and ClusterFacts (rollout.facts) and
return Findings; nothing here runs a command or calls the API (the facts are gathered
before, live or recorded), so every check is tested from recorded data.

- finding: `Finding`, `Severity`, `Branch`, `order_findings` (errors first, the most
  specific cause first).
- advertising, runtime, operator, pods: the branches' checks; health: what the health gates
  read besides (the operator's validator, pending or failed row remaps).
- tree: `diagnose(fleet, now, nodes, pod, unreachable) -> Diagnosis` (`healthy`, `to_json`).
- remedy: `plan_remedies(diagnosis, fleet) -> Remedies` (the plan.yaml `--fix` writes, and
  the findings that need a person).
"""

from rollout.diagnose.finding import Branch, Finding, Severity, order_findings
from rollout.diagnose.remedy import Remedies, plan_remedies
from rollout.diagnose.tree import Diagnosis, diagnose

__all__ = [
    "Branch",
    "Diagnosis",
    "Finding",
    "Remedies",
    "Severity",
    "diagnose",
    "order_findings",
    "plan_remedies",
]
