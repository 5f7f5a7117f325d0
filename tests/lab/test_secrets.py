"""Invariant 9 end to end: a lab node holds registry credentials in its CRI config and an
Authorization header in a mirror's hosts.toml; no output of `plan` (every format), `apply`
or `status`, no Event or annotation, and no run file but the plan itself ever shows them,
and the mirror's header survives rollout's rewrite of its hosts.toml."""

from __future__ import annotations

import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from kubernetes import client

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.run import list_runs, read_run
from tests.lab.labapi import apply_args, fleet_args
from tests.lab.test_cluster_shared import own_lab, ssh_check

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "examples" / "plan.yaml"  # a docker.io mirror: https://mirror.registry.internal:5000
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
HOSTS_TOML = "/etc/containerd/certs.d/docker.io/hosts.toml"
MIRROR = "https://mirror.registry.internal:5000"
CRI = "io.containerd.grpc.v1.cri"

USERNAME = "lab-puller-5e1f"
PASSWORD = "lab-password-0b7d9c"
AUTH = "bGFiLWF1dGgtOWQ0YQ=="
HEADER = "Basic bGFiLWhlYWRlci0zYzhl"
SECRETS = (USERNAME, PASSWORD, AUTH, HEADER)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """One containerd 1.7 node: its toolkit drop-in carries the whole CRI table, so
    rollout rewrites the very file that holds the credentials."""
    with own_lab(tmp_path / "lab", ("1.7",), gpus=1) as built:
        yield built


def put_secrets_on_the_node(lab: Lab) -> None:
    (node,) = lab.nodes
    drop_in: dict[str, Any] = tomllib.loads(ssh_check(lab, node, ["cat", DROP_IN]))
    registry = drop_in["plugins"][CRI].setdefault("registry", {})
    registry.setdefault("configs", {})["registry.internal:5000"] = {
        "auth": {"username": USERNAME, "password": PASSWORD}
    }
    registry.setdefault("auths", {})["https://gcr.io"] = {"auth": AUTH}
    hosts = {
        "server": "https://registry-1.docker.io",
        "host": {
            MIRROR: {
                "capabilities": ["pull", "resolve"],
                "header": {"Authorization": HEADER},
            }
        },
    }
    script = (
        "set -e; umask 077; mkdir -p /etc/containerd/certs.d/docker.io; "
        f"cat > {HOSTS_TOML}; systemctl restart containerd; systemctl is-active containerd"
    )
    ssh_check(lab, node, ["sh", "-c", script], stdin=tomli_w.dumps(hosts).encode())
    ssh_check(
        lab,
        node,
        ["sh", "-c", f"cat > {DROP_IN}.new && mv {DROP_IN}.new {DROP_IN} && "
         "systemctl restart containerd && systemctl is-active containerd"],
        stdin=tomli_w.dumps(drop_in).encode(),
    )  # fmt: skip
    dump = ssh_check(lab, node, ["containerd", "config", "dump"])
    assert PASSWORD in dump, "the credentials are in effect before rollout runs"


def assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} shows {secret!r}"


def cluster_text(lab: Lab) -> str:
    """Every Event and node (annotations included) the API holds, as text."""
    with client.ApiClient(client.Configuration(host=lab.api_url)) as api:
        core = client.CoreV1Api(api)
        events = core.list_event_for_all_namespaces()
        nodes = core.list_node()
        return repr(api.sanitize_for_serialization(events)) + repr(
            api.sanitize_for_serialization(nodes)
        )


def test_credentials_never_show_and_the_mirror_header_survives(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    put_secrets_on_the_node(lab)
    (node,) = lab.nodes
    state = tmp_path / "state"

    for output in ("text", "markdown", "json"):
        code = main(["plan", str(PLAN), *fleet_args(lab), "--output", output, "--color", "always"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert_no_secret(f"plan --output {output}", captured.out + captured.err)
        assert "<redacted" in captured.out, f"plan --output {output} shows the secrets' place"

    code = main(apply_args(lab, PLAN, state))
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert_no_secret("apply", captured.out + captured.err)
    assert main(["status", "--state-dir", str(state)]) == 0
    assert_no_secret("status", capsys.readouterr().out)
    assert_no_secret("Events and nodes", cluster_text(lab))

    # the mirror's header survived the rewrite, in a file still closed to others
    hosts = tomllib.loads(ssh_check(lab, node, ["cat", HOSTS_TOML]))
    assert hosts["host"][MIRROR]["header"] == {"Authorization": HEADER}
    assert "ca" in hosts["host"][MIRROR]  # and the plan's own settings are there
    mode = ssh_check(lab, node, ["stat", "-c", "%a", HOSTS_TOML]).strip()
    assert mode == "600"
    assert PASSWORD in ssh_check(lab, node, ["containerd", "config", "dump"])

    # the run directory: private, and only the plan (apply writes its text) holds secrets
    (run,) = list_runs(state)
    run_dir = state / "runs" / run.run_id
    holding = []
    for path in [run_dir, *run_dir.rglob("*")]:
        mode_bits = stat.S_IMODE(path.stat().st_mode)
        assert mode_bits & 0o077 == 0, f"{path} is {oct(mode_bits)}"
        if path.is_file() and any(s in path.read_text(errors="replace") for s in SECRETS):
            holding.append(path.relative_to(run_dir).as_posix())
    assert set(holding) <= {"plan.json"}, f"secrets in {holding}"
    # backups of files with credentials are no more readable on the node than the files
    for backup in read_run(state, run.run_id).node(node.name).backups:
        mode = ssh_check(lab, node, ["stat", "-c", "%a", backup.backup_path]).strip()
        original = ssh_check(lab, node, ["stat", "-c", "%a", backup.path]).strip()
        assert int(mode, 8) & ~int(original, 8) == 0, f"{backup.backup_path} is {mode}"
