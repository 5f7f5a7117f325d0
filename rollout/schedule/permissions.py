"""The API permissions a plan's run needs, derived from its steps.

docs/permissions.md lists every request rollout makes and the code that makes it; this table
is that list, split by who needs it: every run (fact gathering, the Lease, node marks and
halt checks) and each step kind. A plan's role is the union over the steps its playbooks
give it, so a time-slicing plan cannot evict pods and a containerd plan cannot write
ConfigMaps. tests/unit/test_schedule_permissions.py keeps the union within the audited
manifest (rollout/lab/data/rbac.yaml) and the per-kind lists in docs equal to this table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rollout.lease import LEASE_NAME, LEASE_NAMESPACE
from rollout.planner import change_kinds
from rollout.playbook import Playbook, compose_steps
from rollout.run.cluster import run_object_name
from rollout.spec import Spec, TimeSlicingChange
from rollout.steps.gpu_smoke import SMOKE_NAMESPACE
from rollout.steps.nodemarks import EVENT_NAMESPACE


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource; namespace None is cluster scope or every namespace."""

    group: str
    resource: str
    verb: str
    namespace: str | None = None
    name: str | None = None  # a resourceNames restriction

    def describe(self) -> str:
        group = f" ({self.group})" if self.group else ""
        where = f" in {self.namespace}" if self.namespace else ""
        named = f" named {self.name}" if self.name else ""
        return f"{self.verb} {self.resource}{group}{named}{where}"


def _grants(group: str, resource: str, verbs: str, namespace: str | None = None) -> list[Grant]:
    return [Grant(group, resource, verb, namespace) for verb in verbs.split()]


# Every apply or resume: facts (facts/live.py: each node, its pods, the ClusterPolicy, the
# budgets), the halt-label and budget checks before each node (executor.py), the run and
# left-cordoned marks with their Events (steps/nodemarks.py), and the Lease (lease.py).
RUN_GRANTS: tuple[Grant, ...] = (
    *_grants("", "nodes", "get list patch"),
    *_grants("", "pods", "list"),
    *_grants("nvidia.com", "clusterpolicies", "list"),
    *_grants("policy", "poddisruptionbudgets", "list"),
    *_grants("", "events", "create", EVENT_NAMESPACE),
    Grant("coordination.k8s.io", "leases", "get", LEASE_NAMESPACE, LEASE_NAME),
    Grant("coordination.k8s.io", "leases", "update", LEASE_NAMESPACE, LEASE_NAME),
    # create cannot be limited to a name: the name is not known before the object exists
    Grant("coordination.k8s.io", "leases", "create", LEASE_NAMESPACE),
)

# Per step kind, beyond RUN_GRANTS. Steps that work over SSH only need nothing here.
STEP_GRANTS: dict[str, tuple[Grant, ...]] = {
    "preflight": tuple(_grants("", "nodes", "get")),
    "cordon": tuple(_grants("", "nodes", "get patch")),
    "uncordon": tuple(_grants("", "nodes", "get patch")),
    "drain": (
        *_grants("", "pods", "list get"),
        *_grants("", "pods/eviction", "create"),
    ),
    "containerd.write": (),
    "systemd.restart": (),
    "containerd.verify": (),
    "gpu.wait": tuple(_grants("", "nodes", "get")),
    # the health gates (rollout/steps/gates.py): the kernel clock and log over SSH; the node's
    # resources, its validator pods, and a cordon when a gate fails
    "gates.baseline": (),
    "gates": (*_grants("", "nodes", "get patch"), *_grants("", "pods", "list")),
    "gpu.smoke": (
        *_grants("", "pods", "create get delete", SMOKE_NAMESPACE),
        *_grants("", "pods/log", "get", SMOKE_NAMESPACE),
        # a failed smoke pod's Warning events, quoted in the failure
        *_grants("", "events", "list", SMOKE_NAMESPACE),
    ),
    # the ConfigMap's own namespace is added per change (configmap_grants)
    "configmap.update": (
        *_grants("nvidia.com", "clusterpolicies", "list patch"),
        *_grants("", "nodes", "get"),
    ),
    "node.label": tuple(_grants("", "nodes", "get patch")),
    # the device-plugin pod lives in the operator's namespace, whichever that is
    "deviceplugin.restart": tuple(_grants("", "pods", "list delete")),
    # host-mode driver upgrades (rollout/steps/driver_*.py): the operands leave and come back
    # through their nvidia.com/gpu.deploy.* node labels; the packages and modules change over
    # SSH; a reboot is waited for through the node's Ready condition
    "driver.pause": (*_grants("", "nodes", "get patch"), *_grants("", "pods", "list")),
    "driver.unload": tuple(_grants("", "nodes", "get")),
    "driver.install": tuple(_grants("", "nodes", "get")),
    "driver.reload": tuple(_grants("", "nodes", "get")),
    "driver.verify": (),
    "driver.resume": (*_grants("", "nodes", "get patch"), *_grants("", "pods", "list")),
    # operator-mode driver upgrades (rollout/steps/driver_operator.py): the skip label on
    # every node the driver DaemonSet serves, the ClusterPolicy (its upgradePolicy), the driver
    # pods (in the operator's namespace, whichever that is) and their logs on a failure; the
    # version it patches is the plan's (driver_version_grants)
    "driver.pin": (
        *_grants("", "nodes", "get list patch"),
        *_grants("", "pods", "list"),
        *_grants("nvidia.com", "clusterpolicies", "list"),
    ),
    "driver.release": (
        *_grants("", "nodes", "get list patch"),
        *_grants("", "pods", "list"),
        *_grants("", "pods/log", "get"),
    ),
    "driver.confirm": (
        *_grants("", "nodes", "get"),
        *_grants("", "pods", "list"),
        *_grants("", "pods/log", "get"),
        *_grants("nvidia.com", "clusterpolicies", "list"),
    ),
}

# Steps that reach the node over SSH, and so need the inventory and the SSH Secret.
SSH_STEPS = frozenset(
    {
        "preflight",
        "containerd.write",
        "systemd.restart",
        "containerd.verify",
        "driver.unload",
        "driver.install",
        "driver.reload",
        "driver.verify",
    }
)


def configmap_grants(spec: Spec) -> list[Grant]:
    """The time-slicing ConfigMaps: read for facts, created or replaced by configmap.update."""
    grants: list[Grant] = []
    for change in spec.changes_of(TimeSlicingChange):
        grants += _grants("", "configmaps", "get create update", change.configmap.namespace)
        # configmap.update waits for the operator's DaemonSets to roll out after its write
        grants += _grants("apps", "daemonsets", "list", change.configmap.namespace)
    return grants


def driver_version_grants(spec: Spec, kinds: tuple[str, ...]) -> list[Grant]:
    """Where driver.pin (steps/driver_operator.py) writes the version: the ClusterPolicy, or
    the NVIDIADriver the change names (also listed for facts, facts/driver_operator_live.py)."""
    change = spec.driver_upgrade
    if "driver.pin" not in kinds or change is None:
        return []
    if change.nvidiadriver is None:
        return _grants("nvidia.com", "clusterpolicies", "patch")
    return _grants("nvidia.com", "nvidiadrivers", "get list patch")


def step_kinds_of(spec: Spec, playbooks: Mapping[str, Playbook]) -> tuple[str, ...]:
    """The step kinds a plan's nodes go through, in playbook order."""
    books = [playbooks[kind] for kind in change_kinds(spec)]
    return tuple(dict.fromkeys(step.kind for step in compose_steps(books)))


def grants_for(spec: Spec, playbooks: Mapping[str, Playbook]) -> tuple[Grant, ...]:
    """Exactly what a run of `spec` asks of the API, sorted, without repeats."""
    kinds = step_kinds_of(spec, playbooks)
    unknown = [kind for kind in kinds if kind not in STEP_GRANTS]
    if unknown:
        # a new step kind must say what it asks of the API before it can be scheduled
        raise KeyError(f"no permissions listed for step kind(s) {', '.join(unknown)}")
    grants: set[Grant] = (
        set(RUN_GRANTS) | set(configmap_grants(spec)) | set(driver_version_grants(spec, kinds))
    )
    for kind in kinds:
        grants |= set(STEP_GRANTS[kind])
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
    return FACTS_OVER_SSH or any(kind in SSH_STEPS for kind in step_kinds_of(spec, playbooks))


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
