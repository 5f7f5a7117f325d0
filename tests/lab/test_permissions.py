"""`rollout apply` under the least-privilege kubeconfig `lab up` writes (rollout's
ServiceAccount, bound to the manifest of docs/permissions.md), and what one verb less does."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from rollout.cli import main
from rollout.lab.cluster import CONTEXT, Lab
from rollout.lab.simulation.bootstrap import read_rbac_manifest
from rollout.playbook import load_playbooks
from rollout.schedule.permissions import Grant, schedule_grants
from rollout.spec import parse_spec
from rollout.steps.nodemarks import LEFT_CORDONED_ANNOTATION
from rollout.transports.kube import KubeClient
from rollout.transports.kube.config import load_kubeconfig
from tests.examples import PLAN, REPO, edited_plan
from tests.lab.labapi import apply_args, wait_for
from tests.lab.test_cluster_shared import own_lab
from tests.lab.test_kubectl import (  # noqa: F401 (fixtures)
    Kubectl,
    kubectl,
    registry,
)
from tests.lab.test_schedule import SA, rollout_schedule  # noqa: F401 (fixture)
from tests.unit.test_schedule import plan_text

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

ROLE = next(o for o in read_rbac_manifest() if o["kind"] == "ClusterRole")
ACCOUNT = next(o for o in read_rbac_manifest() if o["kind"] == "ServiceAccount")
MERGE_PATCH = "application/merge-patch+json"
DOC = REPO / "docs" / "permissions.md"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A lab of this module's own: apply changes its nodes for good."""
    with own_lab(tmp_path_factory.mktemp("perm") / "lab", ("1.7", "2.1"), gpus=1) as built:
        yield built


@pytest.fixture
def admin(lab: Lab) -> Iterator[KubeClient]:
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as kube:
        yield kube


@pytest.fixture
def rbac(lab: Lab) -> Iterator[client.RbacAuthorizationV1Api]:
    """The lab's RBAC API as its administrator; the ClusterRole is as shipped afterwards."""
    with client.ApiClient(client.Configuration(host=lab.api_url)) as api:
        rbac = client.RbacAuthorizationV1Api(api)
        yield rbac
        set_rules(rbac, ROLE["rules"])


def set_rules(rbac: client.RbacAuthorizationV1Api, rules: list[dict[str, Any]]) -> None:
    rbac.patch_cluster_role(ROLE["metadata"]["name"], {"rules": rules}, _content_type=MERGE_PATCH)


def whoami(api: client.ApiClient) -> str:
    """`kubectl auth whoami`: the user the server takes the caller for."""
    review = client.V1SelfSubjectReview(
        api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"
    )
    response: Any = client.AuthenticationV1Api(api).create_self_subject_review(
        review, _preload_content=False
    )
    return str(json.loads(response.data)["status"]["userInfo"]["username"])


def place_workload(admin: KubeClient, lab: Lab) -> list[str]:
    """A ReplicaSet-owned pod on every node, so each drain evicts one."""
    names = []
    for node in lab.nodes:
        name = f"workload-{node.name}-{uuid.uuid4().hex[:6]}"
        owner = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "workload",
            "uid": str(uuid.uuid4()),
            "controller": True,
        }
        manifest = {
            "metadata": {"name": name, "ownerReferences": [owner]},
            "spec": {
                "nodeName": node.name,
                "containers": [{"name": "main", "image": "busybox:1.36"}],
            },
        }
        admin.create_pod("default", manifest)
        names.append(name)
    return names


def test_the_documented_manifest_is_the_shipped_one() -> None:
    """docs/permissions.md shows the manifest the lab applies, object for object."""
    text = DOC.read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert [d for d in yaml.safe_load_all(block) if d] == read_rbac_manifest()


@pytest.mark.lab
def test_rollout_kubeconfig_is_the_service_account(lab: Lab) -> None:
    config = yaml.safe_load(lab.rollout_kubeconfig.read_text())
    (user,) = config["users"]
    assert user["user"]["token"]
    assert lab.rollout_kubeconfig.stat().st_mode & 0o777 == 0o600
    with client.ApiClient(client.Configuration(host=lab.api_url)) as api:
        assert whoami(api) == "lab-admin"  # the other kubeconfig: no token
    meta = ACCOUNT["metadata"]
    # loaded as rollout loads it: the Python client sends the token over plain http too
    # (client-go, and so kubectl, would not)
    configuration = load_kubeconfig(str(lab.rollout_kubeconfig), CONTEXT)
    with client.ApiClient(configuration) as api:
        assert whoami(api) == f"system:serviceaccount:{meta['namespace']}:{meta['name']}"


@pytest.mark.lab
def test_apply_under_least_privilege(
    lab: Lab, admin: KubeClient, rbac: client.RbacAuthorizationV1Api, tmp_path: Path
) -> None:
    pods = place_workload(admin, lab)
    assert main(apply_args(lab, PLAN, tmp_path / "state", lab.rollout_kubeconfig)) == 0
    for node in lab.nodes:
        assert not admin.get_node(node.name).unschedulable, node.name
    # every drain evicted its node's pod (pods/eviction, as the ServiceAccount)
    left = {p.name for p in admin.list_pods("default")}
    assert not left & set(pods)


@pytest.mark.lab
def test_one_verb_less_fails_naming_it_and_leaves_no_silent_cordon(
    lab: Lab,
    admin: KubeClient,
    rbac: client.RbacAuthorizationV1Api,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rules = copy.deepcopy(ROLE["rules"])
    eviction = next(r for r in rules if r["resources"] == ["pods/eviction"])
    eviction["verbs"].remove("create")
    rules = [r for r in rules if r["verbs"]]
    set_rules(rbac, rules)
    pods = place_workload(admin, lab)
    # a mirror the nodes do not have yet, so every node has work (and a drain) to do
    plan = edited_plan(tmp_path, "mirror.registry.internal:5000", "mirror2.registry.internal:5000")
    capsys.readouterr()
    assert main(apply_args(lab, plan, tmp_path / "state", lab.rollout_kubeconfig)) == 1
    out = capsys.readouterr()
    said = out.out + out.err
    assert "`create` on `pods/eviction`" in said, said
    assert "--subresource=eviction" in said, said
    for node in lab.nodes:
        found = admin.get_node(node.name)
        assert not found.unschedulable or found.annotations.get(LEFT_CORDONED_ANNOTATION), (
            f"{node.name} is cordoned with no reason on it"
        )
    assert {p.name for p in admin.list_pods("default")} >= set(pods), "nothing was evicted"
    for name in pods:
        admin.delete_pod("default", name, grace_period_s=0, missing_ok=True)
    wait_for(
        lambda: not {p.name for p in admin.list_pods("default")} & set(pods),
        30,
        what="the workload pods to go",
    )


# ------------------------------------------------ checked as the account, with kubectl --as


def can_i_as(kubectl: Kubectl, user: str, verb: str, target: str, *scope: str) -> str:  # noqa: F811
    """`kubectl auth can-i VERB TARGET [scope] --as USER`: what the user may, asked by the
    administrator as docs/permissions.md invites (no token of the account needed)."""
    said = kubectl("auth", "can-i", verb, target, *scope, "--as", user, check=False)
    return str(said.stdout.strip())


def grant_question(grant: Grant) -> tuple[str, str, list[str]]:
    resource, _, sub = grant.resource.partition("/")
    target = f"{resource}.{grant.group}" if grant.group else resource
    if grant.name:
        target += f"/{grant.name}"
    scope = [f"--subresource={sub}"] if sub else []
    scope += ["-n", grant.namespace] if grant.namespace else ["-A"] if target != "nodes" else []
    return grant.verb, target, scope


def test_the_scheduled_accounts_roles_checked_with_kubectl_as(
    kubectl: Kubectl,  # noqa: F811
    rollout_schedule: Callable[..., str],  # noqa: F811
) -> None:
    kubectl("create", "namespace", "gpu-operator")
    kubectl("apply", "-f", "-", stdin=rollout_schedule())
    user = f"system:serviceaccount:rollout:{SA}"
    grants = schedule_grants(parse_spec(plan_text(), "plan.yaml"), load_playbooks(), "rollout")
    assert grants
    for grant in grants:
        verb, target, scope = grant_question(grant)
        assert can_i_as(kubectl, user, verb, target, *scope) == "yes", grant.describe()
    for verb, target, scope in (
        ("list", "secrets", ["-A"]),
        ("get", "secrets", ["-n", "rollout"]),
        ("get", f"secrets/{SA}-ssh", ["-n", "rollout"]),
        ("update", f"secrets/{SA}-ssh", ["-n", "rollout"]),
        ("delete", "nodes", []),
        ("create", "pods", ["-n", "gpu-operator"]),
        ("create", "cronjobs.batch", ["-n", "rollout"]),
        ("impersonate", "users", []),
    ):
        assert can_i_as(kubectl, user, verb, target, *scope) == "no", (verb, target, scope)
    # the administrator asking for itself still may: the answers above were the account's
    assert kubectl("auth", "can-i", "list", "secrets", "-A").stdout == "yes\n"


def test_the_documented_role_checked_with_kubectl_as(kubectl: Kubectl) -> None:  # noqa: F811
    kubectl("create", "namespace", "gpu-operator")
    kubectl("apply", "-f", str(REPO / "rollout" / "lab" / "data" / "rbac.yaml"))
    meta = ACCOUNT["metadata"]
    user = f"system:serviceaccount:{meta['namespace']}:{meta['name']}"
    for rule in ROLE["rules"]:
        for resource in rule["resources"]:
            name, _, sub = resource.partition("/")
            group = rule["apiGroups"][0]
            target = f"{name}.{group}" if group else name
            for verb in rule["verbs"]:
                scope = [f"--subresource={sub}"] if sub else []
                scope += [] if name == "nodes" else ["-A"]
                assert can_i_as(kubectl, user, verb, target, *scope) == "yes", (verb, resource)
    for verb, target, scope in (
        ("list", "secrets", ["-A"]),
        ("update", "nodes", []),
        ("delete", "nodes", []),
        ("create", "pods", ["-A"]),
        ("delete", "configmaps", ["-n", "gpu-operator"]),
        ("patch", "daemonsets.apps", ["-n", "gpu-operator"]),
        ("update", "leases.coordination.k8s.io/other", ["-n", "kube-system"]),
    ):
        assert can_i_as(kubectl, user, verb, target, *scope) == "no", (verb, target, scope)
    lease = ["-n", "kube-system"]
    assert can_i_as(kubectl, user, "update", "leases.coordination.k8s.io/rollout", *lease) == "yes"
