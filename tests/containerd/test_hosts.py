"""hosts.toml rendering and the certs.d directory rule (containerd docs/hosts.md)."""

from __future__ import annotations

import tomllib

import pytest

from rollout.containerd import HostEndpoint, hosts_namespace, hosts_toml_path, render_hosts_toml
from rollout.containerd.hosts import HostsConfigError, merge_hosts_toml


def test_mirror_with_fallback_server_round_trips() -> None:
    text = render_hosts_toml(
        "https://registry-1.docker.io",
        [
            HostEndpoint(
                "https://mirror.internal:5000", ca=("/etc/containerd/certs.d/docker.io/ca.crt",)
            ),
            HostEndpoint("http://10.0.0.5:5000", capabilities=("pull",), skip_verify=True),
            HostEndpoint(
                "https://push.internal",
                capabilities=("pull", "resolve", "push"),
                ca=("a.pem", "b.pem"),
            ),
        ],
    )
    doc = tomllib.loads(text)
    assert doc == {
        "server": "https://registry-1.docker.io",
        "host": {
            "https://mirror.internal:5000": {
                "capabilities": ["pull", "resolve"],
                "ca": "/etc/containerd/certs.d/docker.io/ca.crt",
            },
            "http://10.0.0.5:5000": {"capabilities": ["pull"], "skip_verify": True},
            "https://push.internal": {
                "capabilities": ["pull", "resolve", "push"],
                "ca": ["a.pem", "b.pem"],
            },
        },
    }
    # arrays on one line, as people write them; rendering is stable
    assert 'capabilities = ["pull", "resolve"]' in text
    assert render_hosts_toml(doc["server"], [HostEndpoint("https://m")]) == render_hosts_toml(
        doc["server"], [HostEndpoint("https://m")]
    )
    assert list(doc["host"]) == [
        "https://mirror.internal:5000",
        "http://10.0.0.5:5000",
        "https://push.internal",
    ]  # hosts are tried in the order listed
    assert HostEndpoint("http://10.0.0.5:5000").plain_http


def test_server_only_and_errors() -> None:
    assert tomllib.loads(render_hosts_toml("https://registry.example.com")) == {
        "server": "https://registry.example.com"
    }
    with pytest.raises(HostsConfigError):
        render_hosts_toml(None, [])
    with pytest.raises(HostsConfigError, match="http:// or https://"):
        HostEndpoint("mirror.internal")
    with pytest.raises(HostsConfigError, match="capabilities"):
        HostEndpoint("https://m", capabilities=("pull", "delete"))
    with pytest.raises(HostsConfigError, match="twice"):
        render_hosts_toml(None, [HostEndpoint("https://m"), HostEndpoint("https://m")])


@pytest.mark.parametrize(
    ("registry", "namespace"),
    [
        ("docker.io", "docker.io"),
        ("myregistry.io:5000", "myregistry.io:5000"),
        ("https://myregistry.io:5000/", "myregistry.io:5000"),
        ("192.168.31.250:5000", "192.168.31.250:5000"),
        (None, "_default"),
        ("_default", "_default"),
    ],
)
def test_namespace_directory(registry: str | None, namespace: str) -> None:
    assert hosts_namespace(registry) == namespace
    assert hosts_toml_path("/etc/containerd/certs.d", registry) == (
        f"/etc/containerd/certs.d/{namespace}/hosts.toml"
    )


@pytest.mark.parametrize("bad", ["my registry", "host/path", "-bad.io", "host:port"])
def test_bad_namespace(bad: str) -> None:
    with pytest.raises(HostsConfigError):
        hosts_namespace(bad)


OPERATORS_HOSTS = """server = "https://registry.internal:5000"
ca = "/etc/containerd/certs.d/registry.internal:5000/server-ca.crt"

[host."https://mirror.internal:5000"]
capabilities = ["pull", "resolve", "push"]
skip_verify = true
override_path = true
client = [["/etc/pki/client.crt", "/etc/pki/client.key"]]

[host."https://mirror.internal:5000".header]
Authorization = "Basic c2VjcmV0"
X-Team = ["gpu"]

[host."https://old-mirror.internal"]
capabilities = ["pull"]
"""


def test_rewrite_keeps_the_keys_rollout_does_not_manage() -> None:
    mirror = HostEndpoint("https://mirror.internal:5000")
    text = merge_hosts_toml(OPERATORS_HOSTS, "https://registry.internal:5000", [mirror])
    assert tomllib.loads(text) == {
        "server": "https://registry.internal:5000",
        "ca": "/etc/containerd/certs.d/registry.internal:5000/server-ca.crt",
        "host": {
            "https://mirror.internal:5000": {
                # the plan decides these: its capabilities, no skip_verify
                "capabilities": ["pull", "resolve"],
                # the operator's: kept
                "override_path": True,
                "client": [["/etc/pki/client.crt", "/etc/pki/client.key"]],
                "header": {"Authorization": "Basic c2VjcmV0", "X-Team": ["gpu"]},
            },
            # a mirror the plan no longer lists goes
        },
    }


def test_rewrite_that_changes_nothing_is_the_file_itself() -> None:
    mirror = HostEndpoint("https://mirror.internal:5000")
    once = merge_hosts_toml(OPERATORS_HOSTS, "https://registry.internal:5000", [mirror])
    assert merge_hosts_toml(once, "https://registry.internal:5000", [mirror]) is once
    reordered = 'server = "https://r.io"\n[host."https://m"]\ncapabilities = ["pull", "resolve"]\n'
    assert merge_hosts_toml(reordered, "https://r.io", [HostEndpoint("https://m")]) is reordered


def test_new_or_unreadable_file_is_rendered_fresh() -> None:
    mirror = HostEndpoint("https://m")
    fresh = render_hosts_toml("https://r.io", [mirror])
    assert merge_hosts_toml(None, "https://r.io", [mirror]) == fresh
    assert merge_hosts_toml("server = [broken", "https://r.io", [mirror]) == fresh
    # a header of another host does not move to the new one
    other = '[host."https://x"]\ncapabilities = ["pull"]\n[host."https://x".header]\nA = "b"\n'
    assert merge_hosts_toml(other, "https://r.io", [mirror]) == fresh


# an operator's file as written by hand: comments, indentation, one-line arrays
HAND_WRITTEN = """# docker.io through the team mirror
server = "https://registry-1.docker.io"  # Docker Hub's real endpoint

[host."https://mirror.internal:5000"]
  capabilities = ["pull", "resolve"]   # no push through the mirror
  [host."https://mirror.internal:5000".header]
    Authorization = "Basic c2VjcmV0"
"""
MIRROR = HostEndpoint("https://mirror.internal:5000")


def test_a_file_that_already_says_it_is_a_no_op() -> None:
    # the plan sets no server: the file's own stays, and nothing else differs
    merged = merge_hosts_toml(HAND_WRITTEN, None, [MIRROR], default_server="https://docker.io")
    assert merged is HAND_WRITTEN


def test_existing_server_stays_unless_the_plan_sets_one() -> None:
    second = HostEndpoint("https://second.internal", capabilities=("pull",))
    merged = merge_hosts_toml(
        HAND_WRITTEN, None, [MIRROR, second], default_server="https://docker.io"
    )
    assert tomllib.loads(merged)["server"] == "https://registry-1.docker.io"
    # the plan sets it: the plan's server, the line's comment kept
    merged = merge_hosts_toml(HAND_WRITTEN, "https://docker.io", [MIRROR])
    assert 'server = "https://docker.io"  # Docker Hub\'s real endpoint\n' in merged
    # a new file gets the default server
    fresh = merge_hosts_toml(None, None, [MIRROR], default_server="https://docker.io")
    assert tomllib.loads(fresh)["server"] == "https://docker.io"
    # an existing file without one keeps meaning "the namespace itself"
    serverless = '[host."https://mirror.internal:5000"]\ncapabilities = ["pull", "resolve"]\n'
    assert merge_hosts_toml(serverless, None, [MIRROR], default_server="https://docker.io") is (
        serverless
    )


def test_values_the_plan_does_not_change_keep_their_text() -> None:
    second = HostEndpoint("https://second.internal", capabilities=("pull",))
    merged = merge_hosts_toml(
        HAND_WRITTEN, None, [MIRROR, second], default_server="https://docker.io"
    )
    # every line of the operator's file is still there as written; the new host is appended
    assert merged == HAND_WRITTEN + (
        '\n[host."https://second.internal"]\ncapabilities = ["pull"]\n'
    )


def test_a_changed_value_is_the_only_changed_line() -> None:
    push = HostEndpoint("https://mirror.internal:5000", capabilities=("pull", "resolve", "push"))
    merged = merge_hosts_toml(HAND_WRITTEN, None, [push])
    before, after = HAND_WRITTEN.splitlines(), merged.splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert changed == [
        (
            '  capabilities = ["pull", "resolve"]   # no push through the mirror',
            '  capabilities = ["pull", "resolve", "push"]   # no push through the mirror',
        )
    ]


def test_hosts_follow_the_plans_order_with_their_own_keys() -> None:
    two = HAND_WRITTEN + '\n[host."https://second.internal"]\n  capabilities = ["pull"]\n'
    second = HostEndpoint("https://second.internal", capabilities=("pull",))
    merged = merge_hosts_toml(two, None, [second, MIRROR])
    doc = tomllib.loads(merged)
    assert list(doc["host"]) == ["https://second.internal", "https://mirror.internal:5000"]
    assert doc["host"]["https://mirror.internal:5000"]["header"] == {
        "Authorization": "Basic c2VjcmV0"
    }
    assert '  capabilities = ["pull", "resolve"]   # no push through the mirror' in merged
    assert "\n\n\n" not in merged
