"""SshRunner against real lab nodes: real sshd, key-only root login, strict known_hosts."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import paramiko
import pytest

from rollout.commands import CommandTimeout
from rollout.inventory import Host, load_inventory
from rollout.lab.cluster import Lab
from rollout.transports.errors import (
    HostKeyMismatch,
    HostKeyUnknown,
    SshAuthError,
    SshConnectError,
)
from rollout.transports.fanout import run_on_nodes
from rollout.transports.ssh import SshOptions, SshRunner
from tests.lab.test_cluster_shared import shared_lab

pytestmark = pytest.mark.lab

# Keep the user's ~/.ssh/config out of the tests.
OPTIONS = SshOptions(ssh_config_path=os.devnull, connect_timeout_s=5)
NODE = "lab-node-1"


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return shared_lab(request)


@pytest.fixture(scope="module")
def hosts(lab: Lab) -> dict[str, Host]:
    return {h.name: h for h in load_inventory(lab.inventory).hosts}


@pytest.fixture(scope="module")
def node(hosts: dict[str, Host]) -> Iterator[SshRunner]:
    with SshRunner(hosts[NODE], OPTIONS) as runner:
        yield runner


def test_runs_a_command(node: SshRunner) -> None:
    result = node.run(["containerd", "--version"])
    assert result.ok, result.stderr
    assert result.stdout.startswith("containerd ")
    assert result.host == NODE
    assert result.argv == ("containerd", "--version")


def test_a_non_zero_exit_is_a_result(node: SshRunner) -> None:
    result = node.run(["sh", "-c", "echo out; echo 'err or' >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err or\n")
    missing = node.run(["no-such-command-here"])
    assert missing.exit_code == 127


def test_arguments_reach_the_node_verbatim(node: SshRunner) -> None:
    words = ["a b", "$HOME", "'quoted'", '"double"', "semi;colon", "*", "back\\slash", ""]
    result = node.run(["printf", "%s\\n", *words])
    assert result.stdout.split("\n")[:-1] == words


def test_binary_stdin_arrives_byte_exact(node: SshRunner) -> None:
    payload = bytes(range(256)) * 64 + os.urandom(3 * 1024 * 1024)
    result = node.run(["sha256sum"], stdin=payload)
    assert result.stdout.split()[0] == hashlib.sha256(payload).hexdigest()


def test_a_tar_archive_piped_into_tar_unpacks(node: SshRunner) -> None:
    content = os.urandom(200_000)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("etc/containerd/blob.bin")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    target = f"/tmp/rollout-ssh-test-{os.getpid()}"
    try:
        assert node.run(["mkdir", "-p", target]).ok
        untar = node.run(["tar", "-x", "-C", target], stdin=archive.getvalue())
        assert untar.ok, untar.stderr
        digest = node.run(["sha256sum", f"{target}/etc/containerd/blob.bin"])
        assert digest.stdout.split()[0] == hashlib.sha256(content).hexdigest()
    finally:
        node.run(["rm", "-rf", target])


def test_a_command_that_ignores_stdin_does_not_hang(node: SshRunner) -> None:
    result = node.run(["true"], stdin=os.urandom(4 * 1024 * 1024), timeout_s=20)
    assert result.ok


def test_a_timeout_kills_the_command_on_the_node(node: SshRunner) -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as raised:
        node.run(["sh", "-c", "sleep 31.7; echo never"], timeout_s=1)
    assert 1 <= time.monotonic() - started < 5
    assert raised.value.host == NODE
    # killed with its children, and the connection still serves the next command
    # the bracket keeps the pattern from matching the pgrep command line itself
    left = node.run(["pgrep", "-f", "slee[p] 31.7"])
    assert left.exit_code == 1, left.stdout


def test_one_connection_serves_many_commands(hosts: dict[str, Host]) -> None:
    with SshRunner(hosts[NODE], OPTIONS) as runner:
        seen = {runner.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout for _ in range(20)}
        transports = {runner.transport_id}
    assert len(seen) == 1  # same client address and port: one TCP connection
    assert len(transports) == 1 and None not in transports


def test_fan_out_over_every_node(lab: Lab, hosts: dict[str, Host]) -> None:
    runners = [SshRunner(h, OPTIONS) for h in hosts.values()]
    try:
        outcomes = run_on_nodes(runners, lambda r: r.run(["containerd", "--version"]), 4)
    finally:
        for r in runners:
            r.close()
    assert list(outcomes) == [n.name for n in lab.nodes]
    for name, outcome in outcomes.items():
        assert not isinstance(outcome, Exception), f"{name}: {outcome}"
        assert outcome.ok and outcome.stdout.startswith("containerd ")


# ------------------------------------------------------------------ host keys and auth


def test_an_unknown_host_key_is_refused(hosts: dict[str, Host], tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with (
        SshRunner(replace(hosts[NODE], known_hosts=str(empty)), OPTIONS) as runner,
        pytest.raises(HostKeyUnknown) as raised,
    ):
        runner.run(["true"])
    assert "ssh-keyscan" in str(raised.value) and NODE in str(raised.value)
    assert empty.read_text() == ""


def test_accept_new_adds_the_key_once(lab: Lab, hosts: dict[str, Host], tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    host = replace(hosts[NODE], known_hosts=str(known_hosts))
    accepting = replace(OPTIONS, accept_new_host_keys=True)
    with SshRunner(host, accepting) as runner:
        assert runner.run(["true"]).ok
    recorded = paramiko.HostKeys(str(known_hosts))
    expected = paramiko.HostKeys(str(lab.lab_dir / "known_hosts"))
    assert recorded.lookup(host.address) == expected.lookup(host.address)
    # now known: a strict runner connects, and nothing more is appended
    with SshRunner(host, OPTIONS) as strict:
        assert strict.run(["true"]).ok
    assert len(known_hosts.read_text().splitlines()) == 1


def test_a_changed_host_key_is_refused_even_when_accepting_new_ones(
    lab: Lab, hosts: dict[str, Host], tmp_path: Path
) -> None:
    # another node's real key recorded under this node's address
    lines = (lab.lab_dir / "known_hosts").read_text().splitlines()
    other = next(line for line in lines if not line.startswith(hosts[NODE].address + " "))
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{hosts[NODE].address} {' '.join(other.split()[1:])}\n")
    for options in (OPTIONS, replace(OPTIONS, accept_new_host_keys=True)):
        host = replace(hosts[NODE], known_hosts=str(wrong))
        with SshRunner(host, options) as runner, pytest.raises(HostKeyMismatch) as raised:
            runner.run(["true"])
        assert "HOST KEY CHANGED" in str(raised.value)
        assert NODE in str(raised.value) and "ssh-keygen -R" in str(raised.value)
    assert len(wrong.read_text().splitlines()) == 1


def test_a_key_the_node_does_not_accept(hosts: dict[str, Host], tmp_path: Path) -> None:
    stranger = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    host = replace(hosts[NODE], key_file=str(stranger))
    with (
        SshRunner(host, OPTIONS) as runner,
        pytest.raises(SshAuthError) as raised,
        _without_agent(),
    ):
        runner.run(["true"])
    assert "authentication failed" in str(raised.value) and NODE in str(raised.value)


def test_a_closed_port_is_a_transient_connect_error(hosts: dict[str, Host]) -> None:
    host = replace(hosts[NODE], port=2)
    started = time.monotonic()
    with SshRunner(host, OPTIONS) as runner, pytest.raises(SshConnectError) as raised:
        runner.run(["true"])
    # refused is transient: retried a few times with backoff under the one policy, never
    # waiting out a connect timeout
    assert time.monotonic() - started < 20
    assert f"root@{host.address}:2" in str(raised.value)


class _without_agent:
    """No ssh-agent for the duration: its keys could log in where the test wants a refusal."""

    def __enter__(self) -> None:
        self.saved = os.environ.pop("SSH_AUTH_SOCK", None)

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            os.environ["SSH_AUTH_SOCK"] = self.saved


# ------------------------------------------------------------------ ssh_config


def test_proxy_jump_from_ssh_config_checks_every_hop(
    lab: Lab, hosts: dict[str, Host], tmp_path: Path
) -> None:
    target, jump = hosts[NODE], hosts["lab-node-2"]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host {target.address}\n    ProxyJump root@{jump.address}\n"
        f"Host {jump.address}\n    IdentityFile {jump.key_file}\n"
    )
    options = replace(OPTIONS, ssh_config_path=str(config))
    with SshRunner(target, options) as runner:
        result = runner.run(["hostname"])
        assert result.ok and result.stdout.strip() == NODE
        assert runner.route == f"root@{target.address}:22 via root@{jump.address}:22"
    # the jump host's key is checked as strictly as the node's
    only_target = tmp_path / "known_hosts"
    only_target.write_text(
        "".join(
            line + "\n"
            for line in (lab.lab_dir / "known_hosts").read_text().splitlines()
            if line.startswith(target.address + " ")
        )
    )
    with (
        SshRunner(replace(target, known_hosts=str(only_target)), options) as runner,
        pytest.raises(HostKeyUnknown) as raised,
    ):
        runner.run(["true"])
    assert f"host key of {jump.address} is not in" in str(raised.value)
