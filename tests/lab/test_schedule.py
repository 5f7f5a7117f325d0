"""`rollout schedule` output applied with real kubectl to the lab's API emulator, and the
generated role read back with `kubectl auth can-i` as the ServiceAccount sees it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from rollout.lab.apiserver import Registry
from rollout.lab.apiserver.resources import CRONJOBS
from rollout.playbook import load_playbooks
from rollout.schedule.permissions import Grant, grants_for
from rollout.spec import parse_spec
from tests.lab.test_kubectl import Kubectl, kubectl, registry  # noqa: F401 (fixtures)
from tests.unit.test_schedule import IMAGE, INVENTORY, plan_text

pytestmark = pytest.mark.lab

SA = "rollout-mirror"
NAMESPACES = ("default", "kube-system", "gpu-operator", "rollout")


def schedule_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    from rollout.cli import main

    path = tmp_path / "plan.yaml"
    path.write_text(plan_text())
    assert main(["schedule", str(path), "-i", str(INVENTORY), "--image", IMAGE, *extra]) == 0
    return capsys.readouterr().out


def test_the_schedule_applies_and_the_role_allows_exactly_the_steps(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kubectl("create", "namespace", "gpu-operator")
    out = schedule_yaml(tmp_path, capsys)
    applied = kubectl("apply", "-f", "-", stdin=out).stdout.splitlines()
    assert applied == [
        "namespace/rollout created",
        f"serviceaccount/{SA} created",
        f"clusterrole.rbac.authorization.k8s.io/{SA} created",
        f"clusterrolebinding.rbac.authorization.k8s.io/{SA} created",
        f"role.rbac.authorization.k8s.io/{SA} created",
        f"rolebinding.rbac.authorization.k8s.io/{SA} created",
        f"role.rbac.authorization.k8s.io/{SA} created",
        f"rolebinding.rbac.authorization.k8s.io/{SA} created",
        f"configmap/{SA} created",
        f"cronjob.batch/{SA} created",
    ]
    # the same objects as JSON: nothing to change. kubectl validates a v1 List against the
    # OpenAPI v2 schemas, which the emulator does not serve: the items go as a JSON stream.
    listing = json.loads(schedule_yaml(tmp_path, capsys, "--output", "json"))
    stream = "\n".join(json.dumps(item) for item in listing["items"])
    again = kubectl("apply", "-f", "-", stdin=stream).stdout.splitlines()
    assert all(line.endswith(" unchanged") for line in again), again
    stored = registry.get(CRONJOBS, "rollout", SA)
    spec = stored["spec"]
    assert (spec["concurrencyPolicy"], spec["timeZone"], spec["schedule"]) == (
        "Forbid",
        "Europe/Berlin",
        "0 22 * * 5,6",
    )
    assert spec["jobTemplate"]["spec"]["backoffLimit"] == 0
    fetched = json.loads(kubectl("get", "cronjob", SA, "-n", "rollout", "-o", "json").stdout)
    assert fetched["spec"]["startingDeadlineSeconds"] == 4 * 3600

    token = kubectl("create", "token", SA, "-n", "rollout").stdout.strip()
    expected = grants_for(parse_spec(plan_text(), "plan.yaml"), load_playbooks())
    for namespace in NAMESPACES:
        listed = kubectl("--token", token, "auth", "can-i", "--list", "-n", namespace).stdout
        assert rules_of(listed) == expected_rules(expected, namespace), namespace
    for grant in expected:
        assert can_i(kubectl, token, grant) == "yes", grant.describe()
    # what the steps never do: each refused
    for verb, resource, namespace in (
        ("delete", "nodes", None),
        ("update", "configmaps", "gpu-operator"),
        ("create", "pods", "gpu-operator"),
        ("delete", "pods", "kube-system"),
        ("get", "secrets", "rollout"),
        ("patch", "clusterpolicies.nvidia.com", None),
        ("update", "leases.coordination.k8s.io", "kube-system"),  # only the one named rollout
        ("create", "cronjobs.batch", "rollout"),
    ):
        args = ["--token", token, "auth", "can-i", verb, resource]
        args += ["-n", namespace] if namespace else []
        assert kubectl(*args, check=False).stdout == "no\n", (verb, resource, namespace)


def can_i(kubectl: Kubectl, token: str, grant: Grant) -> str:  # noqa: F811
    resource, _, sub = grant.resource.partition("/")
    target = f"{resource}.{grant.group}" if grant.group else resource
    if grant.name:
        target += f"/{grant.name}"
    args = ["--token", token, "auth", "can-i", grant.verb, target]
    args += [f"--subresource={sub}"] if sub else []
    args += ["-n", grant.namespace] if grant.namespace else ["-A"] if target != "nodes" else []
    return str(kubectl(*args, check=False).stdout.strip())


RuleRow = tuple[str, str, tuple[str, ...]]


def rules_of(listing: str) -> set[RuleRow]:
    """(resource, resourceNames, verbs) rows of `kubectl auth can-i --list` for rollout's
    resources (leaving out what every authenticated user may do: reviews, discovery)."""
    rows: set[RuleRow] = set()
    for line in listing.splitlines()[1:]:
        match = re.match(r"^(\S+)\s+\[[^\]]*\]\s+(\[[^\]]*\])\s+\[([^\]]*)\]$", line.strip())
        if match is None or match.group(1).endswith(
            (".authorization.k8s.io", ".authentication.k8s.io")
        ):
            continue
        resource, names, verbs = match.groups()
        rows.add((resource, names, tuple(sorted(verbs.split()))))
    return rows


def expected_rules(grants: tuple[Grant, ...], namespace: str) -> set[RuleRow]:
    rows: dict[tuple[str, str], set[str]] = {}
    for grant in grants:
        if grant.namespace not in (None, namespace):
            continue
        resource, _, sub = grant.resource.partition("/")
        shown = f"{resource}.{grant.group}" if grant.group else resource
        if sub:
            shown += f"/{sub}"
        names = f"[{grant.name}]" if grant.name else "[]"
        rows.setdefault((shown, names), set()).add(grant.verb)
    return {(r, n, tuple(sorted(v))) for (r, n), v in rows.items()}


def test_the_emulator_refuses_what_the_real_server_refuses(
    kubectl: Kubectl,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    documents = list(yaml.safe_load_all(schedule_yaml(tmp_path, capsys)))
    cronjob = documents[-1]
    cronjob["metadata"]["namespace"] = "default"
    cronjob["spec"]["schedule"] = "61 22 * * *"
    cronjob["spec"]["timeZone"] = "Mars/Olympus"
    cronjob["spec"]["concurrencyPolicy"] = "Sometimes"
    cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    refused = kubectl("apply", "-f", "-", stdin=yaml.safe_dump(cronjob), check=False)
    assert refused.returncode == 1
    for field in (
        "spec.schedule",
        "spec.timeZone",
        "spec.concurrencyPolicy",
        "spec.jobTemplate.spec.template.spec.restartPolicy",
    ):
        assert field in refused.stderr, (field, refused.stderr)
