"""The Kubernetes objects of a scheduled rollout: `rollout schedule PLAN` prints them for
`kubectl apply -f -`.

Namespace (optional), ServiceAccount, the least-privilege ClusterRole and Roles with their
bindings (rollout/schedule/permissions.py: exactly what the plan's steps ask of the API), a
ConfigMap holding the plan (and the inventory when the steps reach nodes over SSH), and a
CronJob whose pod runs `rollout apply --yes` on them. The SSH private key and known_hosts are
only referenced (a Secret the operator creates): rollout never generates or embeds a key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from rollout.errors import BadInput
from rollout.inventory import Inventory
from rollout.playbook import Playbook
from rollout.schedule.forecast import step_worst_s
from rollout.schedule.permissions import (
    needs_ssh,
    schedule_grants,
    split_by_namespace,
    ssh_step_kinds,
    step_kinds_of,
    to_rules,
)
from rollout.schedule.window import nominal_length_s, to_cron
from rollout.spec import Spec
from rollout.steps import step_traits
from rollout.transports.kube.objects import LABEL_INSTANCE, LABEL_NAME

PLAN_DIR = "/etc/rollout/plan"
SSH_DIR = "/etc/rollout/ssh"
PLAN_KEY = "plan.yaml"
INVENTORY_KEY = "inventory.yaml"
# The keys of a kubernetes.io/ssh-auth Secret, plus known_hosts
SSH_KEY = "ssh-privatekey"
KNOWN_HOSTS_KEY = "known_hosts"
DEFAULT_NAMESPACE = "rollout"
BUILTIN_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
# The image's user: nothing in the pod needs root (every node change goes over SSH, every
# cluster change through the API); 65532 is the conventional "nonroot" uid.
NONROOT_UID = 65532
# A Job's name is the CronJob's plus 11 characters; the API refuses CronJob names over 52.
MAX_CRONJOB_NAME = 52
# Without a window nothing bounds a run but this (4 hours), unless --active-deadline says.
DEFAULT_ACTIVE_DEADLINE_S = 4 * 3600
# Without a window a start missed by more than this is skipped until the next schedule.
DEFAULT_STARTING_DEADLINE_S = 300
_PINNED = re.compile(r"^[a-z0-9][a-z0-9._/:-]*(:[A-Za-z0-9._-]+)?@sha256:[0-9a-f]{64}$")
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*?,/-]+$")
_CRON_MACROS = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@hourly"})


@dataclass(frozen=True)
class ScheduleOptions:
    """What `rollout schedule`'s flags choose."""

    image: str
    namespace: str = DEFAULT_NAMESPACE
    create_namespace: bool = True
    cron: str | None = None
    suspend: bool = False
    ssh_secret: str | None = None
    active_deadline_s: int | None = None


@dataclass(frozen=True)
class Schedule:
    """The manifests, and what the operator must provide that rollout will not generate."""

    objects: tuple[dict[str, Any], ...]
    ssh_secret: str | None

    def to_yaml(self) -> str:
        return _header(self) + yaml.dump_all(
            self.objects, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True
        )

    def to_list(self) -> dict[str, Any]:
        """A v1 List, which `kubectl apply -f` takes as JSON."""
        return {"apiVersion": "v1", "kind": "List", "items": list(self.objects)}


def build_schedule(
    spec: Spec,
    plan_text: str,
    playbooks: Mapping[str, Playbook],
    options: ScheduleOptions,
    inventory: Inventory | None = None,
) -> Schedule:
    """Every object of the scheduled rollout of `spec` (whose file text is `plan_text`)."""
    name = object_name(spec)
    check_image(options.image)
    ssh = needs_ssh(spec, playbooks)
    if ssh and inventory is None:
        kinds = ssh_step_kinds(spec, playbooks)
        steps = f" and its steps ({', '.join(kinds)})" if kinds else ""
        raise BadInput(
            f"the run reaches the nodes over SSH (its facts{steps}): pass --inventory FILE;"
            " it goes into the ConfigMap, its key_file and known_hosts pointing at the SSH"
            " Secret"
        )
    schedule, time_zone = cron_schedule(spec, options.cron)
    labels = {LABEL_NAME: "rollout", LABEL_INSTANCE: spec.metadata.name}
    namespace = options.namespace
    objects: list[dict[str, Any]] = []
    if options.create_namespace and namespace not in BUILTIN_NAMESPACES:
        objects.append(_object("v1", "Namespace", namespace, None, labels))
    objects.append(_object("v1", "ServiceAccount", name, namespace, labels))
    objects += rbac_objects(spec, playbooks, name, namespace, labels)
    data = {PLAN_KEY: plan_text}
    if ssh and inventory is not None:
        data[INVENTORY_KEY] = inventory_for_pod(inventory)
    configmap = _object("v1", "ConfigMap", name, namespace, labels)
    configmap["data"] = data
    objects.append(configmap)
    secret = (options.ssh_secret or f"{name}-ssh") if ssh else None
    cronjob = _object("batch/v1", "CronJob", name, namespace, labels)
    cronjob["spec"] = {
        "schedule": schedule,
        "timeZone": time_zone,
        "concurrencyPolicy": "Forbid",
        "startingDeadlineSeconds": starting_deadline_s(spec),
        "suspend": options.suspend,
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 3,
        "jobTemplate": {
            "metadata": {"labels": dict(labels)},
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": active_deadline_s(spec, playbooks, options),
                "template": _pod_template(name, options.image, secret, ssh, labels),
            },
        },
    }
    pod_spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    pod_spec["terminationGracePeriodSeconds"] = termination_grace_s(spec, playbooks)
    objects.append(cronjob)
    return Schedule(tuple(objects), secret)


def object_name(spec: Spec) -> str:
    """`rollout-<plan name>`: every object of the schedule is named after the plan."""
    name = f"rollout-{spec.metadata.name}"
    if len(name) > MAX_CRONJOB_NAME:
        raise BadInput(
            f"{spec.source or 'the plan'}: metadata.name {spec.metadata.name!r} is too long to"
            f" schedule: the CronJob would be named {name!r} ({len(name)} characters) and"
            f" Kubernetes allows {MAX_CRONJOB_NAME}; shorten metadata.name to"
            f" {MAX_CRONJOB_NAME - len('rollout-')} characters or fewer"
        )
    return name


def check_image(image: str) -> None:
    """A pinned image reference: repository@sha256:<digest>, so every run runs one build."""
    if not _PINNED.match(image):
        raise BadInput(
            f"--image {image!r} is not pinned: give a digest, e.g."
            " registry.example/rollout@sha256:<64 hex digits>; after `podman push` the digest"
            " is in `podman inspect --format '{{index .RepoDigests 0}}' IMAGE`"
        )


def cron_schedule(spec: Spec, cron: str | None) -> tuple[str, str]:
    """(schedule, timeZone): --cron, else the opening of the plan's maintenance window; a
    schedule is read in the window's zone (UTC without a window)."""
    window = spec.policy.maintenance_window
    time_zone = window.timezone if window is not None else "UTC"
    if cron is not None:
        return check_cron(cron), time_zone
    if window is None:
        raise BadInput(
            f"{spec.source or 'the plan'}: no policy.maintenance_window to start the runs at,"
            " and no --cron: add a maintenance_window (days, start, end, timezone) to the"
            ' plan\'s policy, or pass --cron "MIN HOUR DOM MON DOW" (read in UTC)'
        )
    return to_cron(window), time_zone


def check_cron(cron: str) -> str:
    """Five cron fields or a macro; a time zone belongs in the window, not in the schedule."""
    text = cron.strip()
    if text in _CRON_MACROS:
        return text
    fields = text.split()
    if "TZ=" in text or "CRON_TZ=" in text:
        raise BadInput(
            f"--cron {cron!r}: Kubernetes refuses TZ= in a schedule; the plan's"
            " maintenance_window.timezone sets the CronJob's timeZone"
        )
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        raise BadInput(
            f"--cron {cron!r} is not a cron schedule: five fields, minute hour"
            ' day-of-month month day-of-week, e.g. "0 22 * * fri" (or @daily, @weekly)'
        )
    return " ".join(fields)


def node_worst_s(spec: Spec, playbooks: Mapping[str, Playbook]) -> int:
    """The longest one node may take: every step of the plan acting, each to its timeout."""
    traits = step_traits()
    kinds = step_kinds_of(spec, playbooks)
    return round(sum(step_worst_s(traits[kind], spec.policy) for kind in kinds))


def active_deadline_s(
    spec: Spec, playbooks: Mapping[str, Playbook], options: ScheduleOptions
) -> int:
    """How long a Job may run: the window, plus the time the node in flight at its close may
    take to finish or roll back (the run starts no node after the close)."""
    if options.active_deadline_s is not None:
        return options.active_deadline_s
    window = spec.policy.maintenance_window
    if window is None:
        return DEFAULT_ACTIVE_DEADLINE_S
    return nominal_length_s(window) + node_worst_s(spec, playbooks)


def termination_grace_s(spec: Spec, playbooks: Mapping[str, Playbook]) -> int:
    """How long a stopped pod (deleted, or past activeDeadlineSeconds) has before SIGKILL:
    on SIGTERM the run lets each node's step in flight finish, so the longest step, and 30 s
    to journal and release the Lease."""
    traits = step_traits()
    kinds = step_kinds_of(spec, playbooks)
    return round(max((step_worst_s(traits[k], spec.policy) for k in kinds), default=0)) + 30


def starting_deadline_s(spec: Spec) -> int:
    """A start missed by more than the window's length would find the window closed."""
    window = spec.policy.maintenance_window
    return nominal_length_s(window) if window is not None else DEFAULT_STARTING_DEADLINE_S


def rbac_objects(
    spec: Spec,
    playbooks: Mapping[str, Playbook],
    name: str,
    namespace: str,
    labels: Mapping[str, str],
) -> list[dict[str, Any]]:
    """The ClusterRole for cluster-wide grants, a Role per namespace for the rest, bound."""
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    objects: list[dict[str, Any]] = []
    grants_by_scope = split_by_namespace(schedule_grants(spec, playbooks, namespace))
    for scope, grants in grants_by_scope.items():
        kind = "ClusterRole" if scope is None else "Role"
        role = _object(RBAC, kind, name, scope, labels)
        role["rules"] = to_rules(grants)
        binding = _object(RBAC, f"{kind}Binding", name, scope, labels)
        binding["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}
        binding["subjects"] = [dict(subject)]
        objects += [role, binding]
    return objects


RBAC = "rbac.authorization.k8s.io/v1"


def inventory_for_pod(inventory: Inventory) -> str:
    """The inventory as the pod reads it: rollout's format, the key and known_hosts from the
    mounted Secret (whatever paths the operator's copy names on their machine)."""
    nodes = []
    for host in inventory.hosts:
        node: dict[str, Any] = {
            "name": host.name,
            "address": host.address,
            "port": host.port,
            "user": host.user,
            "become": host.become,
        }
        if host.groups:
            node["groups"] = sorted(host.groups)
        nodes.append(node)
    document = {
        "apiVersion": "rollout/v1",
        "kind": "Inventory",
        "defaults": {
            "key_file": f"{SSH_DIR}/{SSH_KEY}",
            "known_hosts": f"{SSH_DIR}/{KNOWN_HOSTS_KEY}",
        },
        "nodes": nodes,
    }
    return yaml.safe_dump(document, sort_keys=False)


def _pod_template(
    name: str, image: str, secret: str | None, ssh: bool, labels: Mapping[str, str]
) -> dict[str, Any]:
    args = ["apply", f"{PLAN_DIR}/{PLAN_KEY}", "--yes"]
    if ssh:
        args[2:2] = ["--inventory", f"{PLAN_DIR}/{INVENTORY_KEY}"]
    mounts: list[dict[str, Any]] = [
        {"name": "plan", "mountPath": PLAN_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "plan", "configMap": {"name": name}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if secret is not None:
        mounts.append({"name": "ssh", "mountPath": SSH_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "ssh",
                # group-readable: fsGroup makes the pod's group own the files
                "secret": {"secretName": secret, "defaultMode": 0o440},
            }
        )
    container = {
        "name": "rollout",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["rollout"],
        "args": args,
        "env": [
            {"name": "HOME", "value": "/tmp"},
        ],
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "512Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    return {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "serviceAccountName": name,
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": NONROOT_UID,
                "runAsGroup": NONROOT_UID,
                "fsGroup": NONROOT_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
            "volumes": volumes,
        },
    }


def _object(
    api_version: str, kind: str, name: str, namespace: str | None, labels: Mapping[str, str]
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(labels)
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata}


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the plan, the inventory) as `|` blocks, readable in review."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value and not any(c in value for c in "\t\r") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def _header(schedule: Schedule) -> str:
    lines = ["# rollout schedule: apply with `kubectl apply -f -`"]
    if schedule.ssh_secret is not None:
        namespace = next(
            o["metadata"]["namespace"] for o in schedule.objects if o["kind"] == "CronJob"
        )
        lines += [
            f"# The pod reads its SSH key and known_hosts from the Secret {schedule.ssh_secret},"
            " which rollout does not create:",
            f"#   kubectl create secret generic {schedule.ssh_secret} -n {namespace} \\",
            f"#     --from-file={SSH_KEY}=PATH/TO/KEY"
            f" --from-file={KNOWN_HOSTS_KEY}=PATH/TO/known_hosts",
        ]
    return "\n".join(lines) + "\n"
