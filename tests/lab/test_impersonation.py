"""Impersonation (`kubectl --as`, `--as-group`) as kube-apiserver handles it: allowed by the
`impersonate` verb, answered for the impersonated user by `auth whoami` and `auth can-i`.
Real kubectl 1.36, default flags, kubectl's time limit on every call."""

from __future__ import annotations

from tests.lab.test_kubectl import (  # noqa: F401 (fixtures)
    RBAC,
    Kubectl,
    binding,
    kubectl,
    manifest,
    registry,
)

SA = "system:serviceaccount:default:rollout"


def whoami(kubectl: Kubectl, *args: str) -> dict[str, str]:  # noqa: F811
    said = kubectl("auth", "whoami", *args).stdout
    return {line[:12].strip(): line[12:].strip() for line in said.splitlines()[1:]}


def test_whoami_and_can_i_answer_for_the_impersonated_user(kubectl: Kubectl) -> None:  # noqa: F811
    assert whoami(kubectl, "--as", "nobody") == {
        "Username": "nobody",
        "Groups": "[system:authenticated]",
    }
    assert whoami(kubectl, "--as", SA) == {
        "Username": SA,
        "Groups": "[system:serviceaccounts system:serviceaccounts:default system:authenticated]",
    }
    assert whoami(kubectl, "--as", "ops", "--as-group", "team") == {
        "Username": "ops",
        "Groups": "[team system:authenticated]",
    }
    assert kubectl("auth", "can-i", "list", "secrets", "-A").stdout == "yes\n"
    no = kubectl("auth", "can-i", "list", "secrets", "-A", "--as", "nobody", check=False)
    assert (no.returncode, no.stdout) == (1, "no\n")
    # and what the impersonated user is bound to, it may
    kubectl("apply", "-f", "-", stdin=manifest("v1", "ServiceAccount", "rollout"))
    rule = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["s"]}
    kubectl("apply", "-f", "-", stdin=manifest(RBAC, "Role", "one", rules=[rule]))
    kubectl("apply", "-f", "-", stdin=binding("RoleBinding", "Role", "one"))
    assert kubectl("auth", "can-i", "get", "secret/s", "--as", SA).stdout == "yes\n"
    for refused in (("get", "secret/t"), ("list", "secrets"), ("list", "secrets", "-A")):
        said = kubectl("auth", "can-i", *refused, "--as", SA, check=False)
        assert said.stdout == "no\n", refused
    denied = kubectl("get", "secrets", "--as", SA, check=False)
    assert denied.stderr.strip() == (
        f'Error from server (Forbidden): secrets is forbidden: User "{SA}" cannot list '
        'resource "secrets" in API group "" in the namespace "default"'
    )


def test_impersonation_needs_the_impersonate_verb(kubectl: Kubectl) -> None:  # noqa: F811
    kubectl("apply", "-f", "-", stdin=manifest("v1", "ServiceAccount", "rollout"))
    token = kubectl("create", "token", "rollout").stdout.strip()
    # (whoami words any 403 as "not enabled": a request that shows the server's message)
    refused = kubectl("--token", token, "get", "pods", "--as", "nobody", check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        'Error from server (Forbidden): users "nobody" is forbidden: User '
        f'"{SA}" cannot impersonate resource "users" in API group "" at the cluster scope'
    )
    rules = [
        {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"]},
        {
            "apiGroups": [""],
            "resources": ["serviceaccounts"],
            "verbs": ["impersonate"],
            "resourceNames": ["mirror"],
        },
    ]
    kubectl("apply", "-f", "-", stdin=manifest(RBAC, "ClusterRole", "imp", rules=rules))
    kubectl("apply", "-f", "-", stdin=binding("ClusterRoleBinding", "ClusterRole", "imp"))
    allowed = kubectl("--token", token, "auth", "whoami", "--as", "nobody").stdout
    assert allowed.splitlines()[1].split() == ["Username", "nobody"]
    group = kubectl(
        "--token", token, "get", "pods", "--as", "nobody", "--as-group", "ops", check=False
    )
    assert group.stderr.strip() == (
        'Error from server (Forbidden): groups "ops" is forbidden: User '
        f'"{SA}" cannot impersonate resource "groups" in API group "" at the cluster scope'
    )
    # a ServiceAccount is impersonated as itself, in its namespace
    mirror = "system:serviceaccount:rollout:mirror"
    said = kubectl("--token", token, "auth", "whoami", "--as", mirror).stdout
    assert said.splitlines()[1].split() == ["Username", mirror]
    other = kubectl(
        "--token", token, "get", "pods", "--as", "system:serviceaccount:rollout:x", check=False
    )
    assert other.stderr.strip() == (
        'Error from server (Forbidden): serviceaccounts "x" is forbidden: User '
        f'"{SA}" cannot impersonate resource "serviceaccounts" in API group "" in the '
        'namespace "rollout"'
    )
