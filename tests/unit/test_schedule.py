"""`rollout schedule`: the manifests of a scheduled rollout, and the least privilege they grant."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.cli import main
from rollout.errors import BadInput
from rollout.inventory import load_inventory
from rollout.playbook import load_playbooks
from rollout.schedule.manifests import ScheduleOptions, build_schedule
from rollout.schedule.permissions import RUN_GRANTS, Grant, grants_for, grants_table
from rollout.spec import parse_spec
from rollout.steps import step_kinds, step_traits
from tests.examples import REPO

IMAGE = "registry.example/rollout@sha256:" + "ab" * 32
INVENTORY = REPO / "inventory" / "example.yaml"
WINDOW = (
    "policy:\n  maintenance_window:\n    days: [fri, sat]\n"
    '    start: "22:00"\n    end: "02:00"\n    timezone: Europe/Berlin\n'
)
HEAD = (
    "apiVersion: rollout/v1\nkind: Plan\nmetadata:\n  name: {name}\ntargets:\n  selector: gpu=yes\n"
)
CHANGES = {
    "containerd": (
        "changes:\n  - registry:\n      host: docker.io\n"
        "      endpoints:\n        - url: https://mirror.example:5000\n"
    ),
    "time-slicing": (
        "changes:\n  - time-slicing:\n      profile: shared-4x\n"
        "      configmap: {namespace: operators, name: slicing}\n"
        "      config:\n        version: v1\n        sharing:\n          timeSlicing:\n"
        "            resources:\n              - name: nvidia.com/gpu\n"
        "                replicas: 4\n"
    ),
    "driver-upgrade": (
        'changes:\n  - driver-upgrade:\n      version: "550.127.05"\n      mode: host\n'
    ),
    "driver-operator": (
        'changes:\n  - driver-upgrade:\n      version: "550.127.05"\n      mode: operator\n'
    ),
    "driver-nvidiadriver": (
        'changes:\n  - driver-upgrade:\n      version: "550.127.05"\n      mode: operator\n'
        "      nvidiadriver: pool-a\n"
    ),
}
DOC_SECTIONS = {
    "containerd": "`containerd` plans",
    "time-slicing": "`time-slicing` plans",
    "driver-upgrade": "`driver-upgrade` plans, mode: host",
    "driver-operator": "`driver-upgrade` plans, mode: operator",
    "driver-nvidiadriver": "`driver-upgrade` plans, mode: operator, `nvidiadriver: NAME`",
}


def plan_text(kind: str = "containerd", window: bool = True, name: str = "mirror") -> str:
    return HEAD.format(name=name) + CHANGES[kind] + (WINDOW if window else "")


def schedule_of(text: str, inventory: bool = True, **options: Any) -> dict[str, dict[str, Any]]:
    spec = parse_spec(text, "plan.yaml")
    hosts = load_inventory(INVENTORY) if inventory else None
    built = build_schedule(
        spec, text, load_playbooks(), ScheduleOptions(image=IMAGE, **options), hosts
    )
    return {f"{o['kind']}/{o['metadata'].get('namespace', '')}": o for o in built.objects}


def test_the_objects_of_a_windowed_containerd_plan() -> None:
    objects = schedule_of(plan_text())
    assert list(objects) == [
        "Namespace/",
        "ServiceAccount/rollout",
        "ClusterRole/",
        "ClusterRoleBinding/",
        "Role/default",
        "RoleBinding/default",
        "Role/rollout",
        "RoleBinding/rollout",
        "Role/kube-system",
        "RoleBinding/kube-system",
        "ConfigMap/rollout",
        "CronJob/rollout",
    ]
    assert {o["metadata"]["name"] for o in objects.values()} == {"rollout", "rollout-mirror"}
    # the run kept in the cluster (rollout/run/cluster.py) and the Events on the ConfigMap:
    # only the Secret named after the plan is read and replaced, only its ConfigMap read
    assert objects["Role/rollout"]["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["rollout-mirror"],
            "verbs": ["get"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["rollout-mirror-run"],
            "verbs": ["get", "update"],
        },
    ]
    cron = objects["CronJob/rollout"]["spec"]
    # fri and sat at 22:00 in the window's zone: cron counts Sunday 0
    assert (cron["schedule"], cron["timeZone"]) == ("0 22 * * 5,6", "Europe/Berlin")
    assert cron["concurrencyPolicy"] == "Forbid" and cron["suspend"] is False
    assert cron["startingDeadlineSeconds"] == 4 * 3600  # the window's length
    job = cron["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    # the window (4 h) plus one node at its worst: preflight 60, gates.baseline 60, cordon 60,
    # drain 300, write 60, restart 60, verify 60, gpu.wait 300, smoke 300, gates 60, uncordon 60
    assert job["activeDeadlineSeconds"] == 4 * 3600 + 1380
    pod = job["template"]["spec"]
    # SIGTERM lets the step in flight finish: the longest step (drain, gpu.wait, smoke: 300)
    assert pod["terminationGracePeriodSeconds"] == 300 + 30
    assert pod["serviceAccountName"] == "rollout-mirror"
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["command"] == ["rollout"]
    assert container["args"] == [
        "apply",
        "/etc/rollout/plan/plan.yaml",
        "--inventory",
        "/etc/rollout/plan/inventory.yaml",
        "--yes",
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # no state volume: the run is kept in the cluster, where the next pod finds it
    assert set(volumes) == {"plan", "tmp", "ssh"}
    assert "ROLLOUT_STATE_DIR" not in {e["name"] for e in container["env"]}
    assert volumes["ssh"]["secret"]["secretName"] == "rollout-mirror-ssh"
    assert volumes["plan"]["configMap"]["name"] == "rollout-mirror"


def test_the_configmap_holds_the_plan_as_written_and_a_pod_inventory(tmp_path: Path) -> None:
    text = "# a comment survives\n" + plan_text()
    data = schedule_of(text)["ConfigMap/rollout"]["data"]
    assert data["plan.yaml"] == text
    path = tmp_path / "inventory.yaml"
    path.write_text(data["inventory.yaml"])
    pod_view = load_inventory(path)
    original = load_inventory(INVENTORY)
    assert pod_view.names == original.names
    assert {(h.address, h.port, h.user, h.become) for h in pod_view.hosts} == {
        (h.address, h.port, h.user, h.become) for h in original.hosts
    }
    assert {(h.key_file, h.known_hosts) for h in pod_view.hosts} == {
        ("/etc/rollout/ssh/ssh-privatekey", "/etc/rollout/ssh/known_hosts")
    }


def test_no_secret_is_generated_or_embedded() -> None:
    objects = schedule_of(plan_text(), ssh_secret="site-ssh")
    assert not any(key.startswith("Secret/") for key in objects)
    text = json.dumps(list(objects.values()))
    assert "PRIVATE KEY" not in text and "id_ed25519" not in text
    volumes = objects["CronJob/rollout"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert {"name": "ssh", "secret": {"secretName": "site-ssh", "defaultMode": 0o440}} in volumes[
        "volumes"
    ]


def test_cron_flag_suspend_namespace_and_deadline() -> None:
    objects = schedule_of(
        plan_text(window=False),
        cron="30 1 * * sun",
        suspend=True,
        namespace="kube-system",
        active_deadline_s=600,
    )
    assert "Namespace/" not in objects  # a built-in namespace is not created
    cron = objects["CronJob/kube-system"]["spec"]
    assert (cron["schedule"], cron["timeZone"], cron["suspend"]) == ("30 1 * * sun", "UTC", True)
    assert cron["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 600
    assert "Namespace/" not in schedule_of(plan_text(), create_namespace=False)


@pytest.mark.parametrize(
    ("text", "options", "inventory", "message"),
    [
        (
            plan_text(window=False),
            {},
            True,
            "no policy.maintenance_window to start the runs at, and no --cron",
        ),
        (plan_text(), {"cron": "TZ=UTC 0 1 * * *"}, True, "refuses TZ="),
        (plan_text(), {"cron": "every night"}, True, "is not a cron schedule"),
        (plan_text(), {}, False, "its steps (preflight, gates.baseline, containerd"),
        (plan_text(name="a" * 45), {}, True, "shorten metadata.name to 44 characters"),
    ],
)
def test_bad_input_is_refused_with_what_to_do(
    text: str, options: dict[str, Any], inventory: bool, message: str
) -> None:
    with pytest.raises(BadInput, match=re.escape(message)):
        schedule_of(text, inventory=inventory, **options)


@pytest.mark.parametrize(
    "image", ["rollout:latest", "rollout", "registry.example/rollout@sha256:abc"]
)
def test_the_image_must_be_pinned_by_digest(image: str) -> None:
    spec = parse_spec(plan_text(), "plan.yaml")
    with pytest.raises(BadInput, match="is not pinned"):
        build_schedule(
            spec,
            plan_text(),
            load_playbooks(),
            ScheduleOptions(image=image),
            load_inventory(INVENTORY),
        )


def grants_of(kind: str) -> set[Grant]:
    return set(grants_for(parse_spec(plan_text(kind), "plan.yaml"), load_playbooks()))


def has(grants: set[Grant], resource: str, verb: str, namespace: str | None = None) -> bool:
    return any(
        g.resource == resource and g.verb == verb and g.namespace in (None, namespace)
        for g in grants
    )


def test_each_kind_gets_only_what_its_steps_use() -> None:
    containerd, slicing, driver = (
        grants_of("containerd"),
        grants_of("time-slicing"),
        grants_of("driver-upgrade"),
    )
    assert has(containerd, "pods/eviction", "create")
    assert not has(containerd, "configmaps", "update", "operators")
    assert not has(containerd, "clusterpolicies", "patch")
    assert not has(containerd, "pods", "delete", "gpu-operator")  # smoke pods only in default
    assert has(containerd, "pods", "delete", "default")
    assert not has(slicing, "pods/eviction", "create")
    assert has(slicing, "configmaps", "update", "operators")
    assert not has(slicing, "configmaps", "update", "gpu-operator")
    assert has(slicing, "clusterpolicies", "patch")
    assert has(slicing, "pods", "delete", "gpu-operator")  # the device-plugin restart
    assert has(driver, "pods/eviction", "create")
    assert not has(driver, "clusterpolicies", "patch")
    assert not has(driver, "nvidiadrivers", "patch")
    assert not has(grants_of("driver-operator"), "nvidiadrivers", "list")
    assert has(grants_of("driver-nvidiadriver"), "nvidiadrivers", "patch")


def test_every_step_kind_says_what_it_asks_of_the_api() -> None:
    assert set(step_kinds()) <= set(step_traits())


def rbac_manifest_grants() -> set[tuple[str, str, str, str | None]]:
    """(group, resource, verb, namespace) of the audited manifest docs/permissions.md shows."""
    found = set()
    for doc in yaml.safe_load_all((REPO / "rollout/lab/data/rbac.yaml").read_text()):
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        namespace = doc["metadata"].get("namespace")
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        found.add((group, resource, verb, namespace))
    return found


# Granted by the audited manifest for `diagnose` and `facts record`, which a scheduled apply
# never runs.
DIAGNOSE_ONLY = {
    ("", "pods/log", "get", None),
    ("", "events", "list", None),
    ("node.k8s.io", "runtimeclasses", "list", None),
}


def test_every_kind_together_is_the_audited_manifest_less_diagnose() -> None:
    """The union over every kind grants nothing the audit (docs/permissions.md) did not find,
    and misses nothing apply needs: namespaced grants may narrow a cluster-wide one."""
    text = HEAD.format(name="all") + CHANGES["containerd"]
    text += CHANGES["time-slicing"].replace("changes:\n", "")
    text = text.replace("namespace: operators", "namespace: gpu-operator")
    union = grants_for(parse_spec(text, "plan.yaml"), load_playbooks())
    # a driver-upgrade is a plan of its own: its NVIDIADriver grants join the union
    union += grants_for(parse_spec(plan_text("driver-nvidiadriver"), "plan.yaml"), load_playbooks())
    audited = rbac_manifest_grants()
    for grant in union:
        key = (grant.group, grant.resource, grant.verb)
        assert (*key, grant.namespace) in audited or (*key, None) in audited, grant
    for group, resource, verb, namespace in audited - DIAGNOSE_ONLY:
        assert any(
            (g.group, g.resource, g.verb) == (group, resource, verb)
            and (namespace is None or g.namespace in (None, namespace))
            for g in union
        ), (group, resource, verb, namespace)
    assert set(RUN_GRANTS) <= set(union)


def test_the_per_kind_lists_in_the_docs_are_the_code() -> None:
    docs = (REPO / "docs" / "permissions.md").read_text()
    for kind in CHANGES:
        section = docs.split(f"### {DOC_SECTIONS[kind]}\n", 1)
        assert len(section) == 2, f"docs/permissions.md has no section for {kind} plans"
        rows = [line for line in section[1].split("\n\n")[1].splitlines() if line.startswith("| `")]
        text = plan_text(kind).replace("namespace: operators", "namespace: gpu-operator")
        grants = grants_for(parse_spec(text, "plan.yaml"), load_playbooks())
        assert rows == grants_table(grants), kind


def test_the_command_prints_yaml_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(plan_text())
    args = ["schedule", str(path), "-i", str(INVENTORY), "--image", IMAGE]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("# rollout schedule")
    assert "kubectl create secret generic rollout-mirror-ssh -n rollout" in out
    documents = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in documents][-1] == "CronJob"
    assert documents[-2]["data"]["plan.yaml"] == plan_text()
    assert main([*args, "--output", "json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["kind"] == "List" and listing["items"] == documents


def test_the_command_without_window_or_cron_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(plan_text(window=False))
    assert main(["schedule", str(path), "-i", str(INVENTORY), "--image", IMAGE]) == 2
    err = capsys.readouterr().err
    assert "no policy.maintenance_window" in err and "--cron" in err
