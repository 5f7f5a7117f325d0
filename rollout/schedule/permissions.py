"""The API permissions a plan's run needs, derived from its steps.

docs/permissions.md lists every request rollout makes and the code that makes it; this module
and the step classes are that list, split by who needs it: every run (fact gathering, the
Lease, node marks and halt checks) here, and each step kind in its class's `traits`
(rollout.steps.traits). A plan's role is the union over the steps its playbooks give it,
so a time-slicing plan cannot evict pods and a containerd plan cannot write ConfigMaps.
tests/unit/test_schedule.py keeps the union within the audited manifest
(rollout/lab/data/rbac.yaml) and the per-kind lists in docs equal to the code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rollout.changes import kind_planners
from rollout.changes.base import ChangeKindPlanner, kind_of
from rollout.lease import LEASE_NAME, LEASE_NAMESPACE
from rollout.planner import change_kinds
from rollout.playbook import Playbook, compose_steps
from rollout.rbac import Grant, grants_of
from rollout.run.cluster import run_object_name
from rollout.spec import Spec
from rollout.steps import step_traits
from rollout.steps.nodemarks import EVENT_NAMESPACE

__all__ = ["Grant"]  # declared with the steps (rollout.steps.traits); the tests import it here


# Every apply or resume: facts (facts/live.py: each node, its pods, the ClusterPolicy, the
# budgets), the halt-label and budget checks before each node (executor.py), the run and
# left-cordoned marks with their Events (steps/nodemarks.py), and the Lease (lease.py).
RUN_GRANTS: tuple[Grant, ...] = (
    *grants_of("", "nodes", "get list patch"),
    *grants_of("", "pods", "list"),
    *grants_of("nvidia.com", "clusterpolicies", "list"),
    *grants_of("policy", "poddisruptionbudgets", "list"),
    *grants_of("", "events", "create", EVENT_NAMESPACE),
    Grant("coordination.k8s.io", "leases", "get", LEASE_NAMESPACE, LEASE_NAME),
    Grant("coordination.k8s.io", "leases", "update", LEASE_NAMESPACE, LEASE_NAME),
    # create cannot be limited to a name: the name is not known before the object exists
    Grant("coordination.k8s.io", "leases", "create", LEASE_NAMESPACE),
)


def change_grants(
    spec: Spec, step_kinds: tuple[str, ...], kinds: Mapping[str, ChangeKindPlanner]
) -> set[Grant]:
    """What each change asks beyond its steps' grants, its kind says (`grants`): a time-slicing
    ConfigMap's namespace, where driver.pin writes the version."""
    return {g for c in spec.changes for g in kind_of(kinds, c).grants(c, step_kinds)}


def step_kinds_of(
    spec: Spec,
    playbooks: Mapping[str, Playbook],
    kinds: Mapping[str, ChangeKindPlanner] | None = None,
) -> tuple[str, ...]:
    """The step kinds a plan's nodes go through, in playbook order."""
    books = [playbooks[kind] for kind in change_kinds(spec, kinds)]
    return tuple(dict.fromkeys(step.kind for step in compose_steps(books)))


def grants_for(
    spec: Spec,
    playbooks: Mapping[str, Playbook],
    kinds: Mapping[str, ChangeKindPlanner] | None = None,
) -> tuple[Grant, ...]:
    """Exactly what a run of `spec` asks of the API, sorted, without repeats (the change
    kinds: the registered ones unless given)."""
    planners = kind_planners() if kinds is None else kinds
    step_kinds = step_kinds_of(spec, playbooks, planners)
    traits = step_traits()
    unknown = [kind for kind in step_kinds if kind not in traits]
    if unknown:
        raise KeyError(f"no step class declares what step kind(s) {', '.join(unknown)} ask")
    grants = set(RUN_GRANTS) | change_grants(spec, step_kinds, planners)
    for kind in step_kinds:
        grants |= set(traits[kind].grants)
    # a namespaced grant that a cluster-wide one already covers adds nothing
    wide = {(g.group, g.resource, g.verb) for g in grants if g.namespace is None and not g.name}
    grants = {g for g in grants if g.namespace is None or (g.group, g.resource, g.verb) not in wide}
    return tuple(sorted(grants, key=_sort_key))


def scheduled_run_grants(plan_name: str, namespace: str) -> tuple[Grant, ...]:
    """What the scheduled pod adds, in the schedule's namespace: its run kept in the Secret
    named after the plan (rollout/run/cluster.py: read, created, replaced), and the Events
    on the plan's ConfigMap (a window closing, a run done)."""
    kept = run_object_name(plan_name)
    return (
        # the plan's ConfigMap is read for its uid, which the Events name
        Grant("", "configmaps", "get", namespace, f"rollout-{plan_name}"),
        Grant("", "secrets", "get", namespace, kept),
        Grant("", "secrets", "update", namespace, kept),
        # create cannot be limited to a name: the name is not known before the object exists
        Grant("", "secrets", "create", namespace),
        Grant("", "events", "create", namespace),
    )


def schedule_grants(
    spec: Spec, playbooks: Mapping[str, Playbook], namespace: str
) -> tuple[Grant, ...]:
    """The role of `rollout schedule`: the run's own (grants_for) and the scheduled pod's."""
    grants = set(grants_for(spec, playbooks)) | set(
        scheduled_run_grants(spec.metadata.name, namespace)
    )
    # policy.notify: get on exactly each Secret a webhook's URL is read from
    for hook in spec.policy.notify:
        if (secret := hook.url_from.secret) is not None:
            grants.add(Grant("", "secrets", "get", secret.namespace or namespace, secret.name))
    return tuple(sorted(grants, key=_sort_key))


# Every run gathers its facts over SSH first (facts/live.py probes each inventory node),
# whatever its steps: so today every plan needs the inventory and the key.
FACTS_OVER_SSH = True


def needs_ssh(spec: Spec, playbooks: Mapping[str, Playbook]) -> bool:
    """True when the run reaches nodes over SSH: for its facts, or in some step."""
    return FACTS_OVER_SSH or bool(ssh_step_kinds(spec, playbooks))


def ssh_step_kinds(spec: Spec, playbooks: Mapping[str, Playbook]) -> tuple[str, ...]:
    """The plan's step kinds that reach the node over SSH, in playbook order."""
    traits = step_traits()
    return tuple(kind for kind in step_kinds_of(spec, playbooks) if traits[kind].uses_ssh)


def to_rules(grants: Iterable[Grant]) -> list[dict[str, object]]:
    """RBAC rules: one per (group, resource, name), verbs sorted, in a stable order."""
    verbs: dict[tuple[str, str, str | None], set[str]] = {}
    for grant in grants:
        verbs.setdefault((grant.group, grant.resource, grant.name), set()).add(grant.verb)
    rules: list[dict[str, object]] = []
    for (group, resource, name), found in sorted(verbs.items(), key=lambda i: _rule_key(i[0])):
        rule: dict[str, object] = {"apiGroups": [group], "resources": [resource]}
        if name is not None:
            rule["resourceNames"] = [name]
        rule["verbs"] = sorted(found, key=_verb_order)
        rules.append(rule)
    return rules


def split_by_namespace(grants: Sequence[Grant]) -> dict[str | None, list[Grant]]:
    """Cluster-wide grants under None (a ClusterRole), the rest per namespace (Roles)."""
    split: dict[str | None, list[Grant]] = {}
    for grant in grants:
        split.setdefault(grant.namespace, []).append(grant)
    return split


def grants_table(grants: Sequence[Grant]) -> list[str]:
    """Markdown rows `| resource (group) | verbs | scope |` as docs/permissions.md lists them."""
    rows: dict[tuple[str, str, str | None, str | None], set[str]] = {}
    for grant in grants:
        key = (grant.group, grant.resource, grant.namespace, grant.name)
        rows.setdefault(key, set()).add(grant.verb)
    lines = []
    for (group, resource, namespace, name), verbs in sorted(
        rows.items(), key=lambda i: _row_key(i[0])
    ):
        label = f"`{resource}`" + (f" (`{group}`)" if group else "")
        if name:
            label += f" named `{name}`"
        scope = f"`{namespace}`" if namespace else "cluster / all namespaces"
        shown = ", ".join(f"`{v}`" for v in sorted(verbs, key=_verb_order))
        lines.append(f"| {label} | {shown} | {scope} |")
    return lines


_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
_RESOURCE_ORDER = (
    "nodes",
    "pods",
    "pods/eviction",
    "pods/log",
    "events",
    "configmaps",
    "secrets",
    "leases",
    "clusterpolicies",
    "nvidiadrivers",
    "poddisruptionbudgets",
)


def _verb_order(verb: str) -> int:
    return _VERBS.index(verb) if verb in _VERBS else len(_VERBS)


def _resource_order(resource: str) -> int:
    return _RESOURCE_ORDER.index(resource) if resource in _RESOURCE_ORDER else len(_RESOURCE_ORDER)


def _rule_key(key: tuple[str, str, str | None]) -> tuple[int, str, str, str]:
    group, resource, name = key
    return (_resource_order(resource), resource, group, name or "")


def _row_key(key: tuple[str, str, str | None, str | None]) -> tuple[int, str, str, str, str]:
    group, resource, namespace, name = key
    return (_resource_order(resource), resource, namespace or "", group, name or "")


def _sort_key(grant: Grant) -> tuple[int, str, str, str, int, str]:
    return (
        _resource_order(grant.resource),
        grant.resource,
        grant.namespace or "",
        grant.name or "",
        _verb_order(grant.verb),
        grant.group,
    )
