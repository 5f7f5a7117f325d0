"""Invariant 9: registry credentials a node holds never reach output; a run's files are
private to their user."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

from rollout.changes.containerd.steps import as_saved
from rollout.cli.render import make_console, plan_to_json, plan_to_markdown, print_plan_text
from rollout.plan import EffectiveChange, FileChange, NodePlan, Plan, StepPlan, Wave
from rollout.run import Journal
from rollout.secrets import (
    REDACTED,
    REDACTED_CHANGED,
    is_secret_path,
    redact_change,
    redact_diff,
    redact_toml,
    redact_toml_pair,
)

SECRETS = ("hunter2", "bob-the-puller", "Zm9vOmJhcg==", "eyJ0b2tlbiI6MX0", "Basic c2VjcmV0")
CRI_V2 = """version = 2
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = ""
[plugins."io.containerd.grpc.v1.cri".registry.configs."registry.internal:5000".auth]
  username = "bob-the-puller"
  password = "hunter2"
[plugins."io.containerd.grpc.v1.cri".registry.auths."https://gcr.io"]
  auth = "Zm9vOmJhcg=="
  identitytoken = \"\"\"
eyJ0b2tlbiI6MX0\"\"\"
[plugins."io.containerd.grpc.v1.cri".registry.configs."inline.io"]
  auth = { password = "hunter2" }
"""
HOSTS = """server = "https://registry.internal:5000"

[host."https://mirror.internal:5000"]
capabilities = ["pull", "resolve"]
override_path = true

[host."https://mirror.internal:5000".header]
Authorization = "Basic c2VjcmV0"
"""


def no_secret_in(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


def test_which_paths_are_secret() -> None:
    cri = ("plugins", "io.containerd.grpc.v1.cri", "registry")
    assert is_secret_path((*cri, "configs", "r.io", "auth", "password"))
    assert is_secret_path((*cri, "configs", "r.io", "auth"))
    assert is_secret_path((*cri, "auths", "https://gcr.io", "identitytoken"))
    assert is_secret_path(("host", "https://m", "header", "Authorization"))
    assert is_secret_path(("header", "X-Token"))
    assert not is_secret_path((*cri, "config_path"))
    assert not is_secret_path((*cri, "configs", "r.io", "tls", "ca_file"))
    assert not is_secret_path(("host", "https://m", "capabilities"))


def test_redacted_toml_keeps_everything_but_the_secret_values() -> None:
    shown = redact_toml(CRI_V2)
    no_secret_in(shown)
    assert 'config_path = ""' in shown
    assert f"  password = {REDACTED}" in shown
    assert "eyJ0b2tlbiI6MX0" not in shown and "identitytoken = <redacted>" in shown
    assert f"  auth = {REDACTED}\n" in shown  # the inline table goes whole
    hosts = redact_toml(HOSTS)
    no_secret_in(hosts)
    assert f"Authorization = {REDACTED}" in hosts and "override_path = true" in hosts


def test_a_changed_secret_shows_that_it_changed_and_nothing_else() -> None:
    after = CRI_V2.replace("hunter2", "correct-horse").replace(
        'config_path = ""', "config_path = 'x'"
    )
    change = FileChange("/etc/containerd/config.toml", CRI_V2, after, "intent")
    diff = change.unified_diff()
    no_secret_in(diff)
    assert "correct-horse" not in diff
    assert f"-  password = {REDACTED}\n" in diff
    assert f"+  password = {REDACTED_CHANGED}\n" in diff
    assert "+  config_path = 'x'\n" in diff
    assert "+  username" not in diff  # an unchanged secret makes no diff line
    # the plan still carries the real text: apply writes it
    assert "correct-horse" in (change.after or "")
    created = FileChange(
        "/etc/containerd/certs.d/r/hosts.toml", None, HOSTS, "mirror"
    ).unified_diff()
    no_secret_in(created)
    assert f"+Authorization = {REDACTED_CHANGED}" in created
    assert redact_toml_pair(None, None) == (None, None)


def test_a_diff_whose_hunk_starts_below_its_table_hides_credential_keys() -> None:
    diff = (
        '@@ -7,2 +7,2 @@\n   username = "bob-the-puller"\n'
        '-  password = "a"\n+  password = "hunter2"\n'
    )
    shown = redact_diff(diff)
    no_secret_in(shown)
    assert f"+  password = {REDACTED_CHANGED}" in shown and f"-  password = {REDACTED}" in shown


def test_effective_values_are_redacted_leaf_by_leaf() -> None:
    path = ("plugins", "io.containerd.grpc.v1.cri", "registry", "configs")
    before = {"r.io": {"auth": {"password": "hunter2"}, "tls": {"insecure_skip_verify": False}}}
    after = {"r.io": {"auth": {"password": "hunter2"}, "tls": {"insecure_skip_verify": True}}}
    old, new = redact_change(path, before, after)
    assert old == {"r.io": {"auth": REDACTED, "tls": {"insecure_skip_verify": False}}}
    assert new == {"r.io": {"auth": REDACTED, "tls": {"insecure_skip_verify": True}}}
    assert redact_change((*path, "r.io", "auth", "password"), "a", "hunter2") == (
        REDACTED,
        REDACTED_CHANGED,
    )


def secret_plan() -> Plan:
    after = CRI_V2.replace('config_path = ""', 'config_path = "/etc/containerd/certs.d"')
    node = NodePlan(
        name="gpu-1",
        containerd_version="1.7.24",
        steps=(StepPlan(kind="containerd.write", why="", action="write 2 files"),),
        files=(
            FileChange("/etc/containerd/config.toml", CRI_V2, after.replace("hunter2", "pw2"), "x"),
            FileChange("/etc/containerd/certs.d/r/hosts.toml", None, HOSTS, "mirror"),
        ),
        effective_changes=(
            EffectiveChange(
                path='plugins."io.containerd.grpc.v1.cri".registry.configs."r.io"',
                before=None,
                after={"auth": {"username": "bob-the-puller", "password": "hunter2"}},
                intended=False,
            ),
            EffectiveChange(
                path='plugins."io.containerd.grpc.v1.cri".registry.configs."r.io".auth.password',
                before="hunter2",
                after="Zm9vOmJhcg==",
                intended=True,
            ),
        ),
        effective_diff=(
            "--- effective before\n+++ effective after\n@@ -1,3 +1,3 @@\n"
            ' [plugins."io.containerd.grpc.v1.cri".registry.configs."r.io".auth]\n'
            '-identitytoken = "eyJ0b2tlbiI6MX0"\n+identitytoken = "hunter2"\n'
        ),
    )
    return Plan(
        name="p", source="p.yaml", facts_source="live", changes=("registry",),
        waves=(Wave(1, (node,)),),
    )  # fmt: skip


def test_no_output_format_prints_a_secret() -> None:
    plan = secret_plan()
    out = io.StringIO()
    print_plan_text(plan, make_console(out, color=True))
    for text in (out.getvalue(), plan_to_markdown(plan), plan_to_json(plan)):
        no_secret_in(text)
        assert "pw2" not in text
        assert REDACTED_CHANGED in text
    data = json.loads(plan_to_json(plan))
    files = data["waves"][0]["nodes"][0]["files"]
    assert f"Authorization = {REDACTED_CHANGED}" in files[1]["after"]
    # the plan object itself is untouched: apply writes the real text
    assert "hunter2" in (plan.nodes[0].files[0].before or "")


def test_run_directory_and_files_are_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Journal.create(state, "p", json.dumps({"secret": "hunter2"})) as journal:
        journal.save_step_data("gpu-1", "containerd.write", {"before": CRI_V2})
        run_dir = journal.run_dir
    for path in [run_dir, *run_dir.rglob("*"), state / "runs"]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    assert stat.S_IMODE((run_dir / "plan.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700


def test_saved_dumps_hold_no_credentials_and_still_compare() -> None:
    """containerd.write journals its predicted dumps; verify compares the live one to them."""
    dump = {"plugins": {"io.containerd.grpc.v1.cri": {"registry": {"configs": {
        "r.io": {"auth": {"username": "bob-the-puller", "password": "hunter2"}}},
        "config_path": "/etc/containerd/certs.d"}}}}  # fmt: skip
    saved = as_saved(dump)
    no_secret_in(json.dumps(saved))
    assert as_saved(saved) == saved == as_saved(json.loads(json.dumps(dump)))
    registry = saved["plugins"]["io.containerd.grpc.v1.cri"]["registry"]
    assert registry["config_path"] == "/etc/containerd/certs.d"
