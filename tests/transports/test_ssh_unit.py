"""SshRunner without a network: command lines, error translation, host key policy."""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import paramiko
import pytest

from rollout.errors import TransientError
from rollout.inventory import Host
from rollout.transports.errors import (
    HostKeyMismatch,
    HostKeyUnknown,
    SshAuthError,
    SshConnectError,
    SshError,
    SshProtocolError,
    SshResolveError,
)
from rollout.transports.hostkeys import HostKeyPolicy, KnownHostsBook, UnknownHostKey
from rollout.transports.ssh import SshOptions, SshRunner

NO_SSH_CONFIG = SshOptions(ssh_config_path="/dev/null")


def runner(tmp_path: Path, **host: object) -> SshRunner:
    fields: dict[str, object] = {
        "name": "gpu-1",
        "address": "10.0.0.7",
        "known_hosts": str(tmp_path / "known_hosts"),
    }
    fields.update(host)
    return SshRunner(Host(**fields), NO_SSH_CONFIG)  # type: ignore[arg-type]


# ------------------------------------------------------------------ command lines


def test_argv_is_quoted_and_run_under_timeout(tmp_path: Path) -> None:
    line = runner(tmp_path).command_line(["sh", "-c", "echo 'a b'; echo $HOME"], 30)
    assert shlex.split(line) == [
        "timeout",
        "--kill-after=5s",
        "30.000s",
        "sh",
        "-c",
        "echo 'a b'; echo $HOME",
    ]


def test_become_uses_sudo_without_a_password_prompt(tmp_path: Path) -> None:
    line = runner(tmp_path, user="ubuntu", become=True).command_line(["id", "-u"], 5)
    assert shlex.split(line)[:6] == ["sudo", "-n", "--", "timeout", "--kill-after=5s", "5.000s"]
    assert shlex.split(line)[-2:] == ["id", "-u"]
    # root needs no sudo, and become without it changes nothing
    assert "sudo" not in runner(tmp_path, user="root", become=True).command_line(["id"], 5)
    assert "sudo" not in runner(tmp_path, user="ubuntu").command_line(["id"], 5)


def test_an_empty_argv_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        runner(tmp_path).command_line([], 5)


def test_identity_and_target(tmp_path: Path) -> None:
    r = runner(tmp_path, user="ops", port=2222)
    assert r.host == "gpu-1"
    assert r.target == "ops@10.0.0.7:2222"
    assert r.known_hosts == tmp_path / "known_hosts"
    assert runner(tmp_path, address="fd00::7").target == "root@[fd00::7]:22"


def test_known_hosts_defaults_to_the_users_file(tmp_path: Path) -> None:
    r = SshRunner(Host(name="n", address="10.0.0.1"), NO_SSH_CONFIG)
    assert r.known_hosts == Path("~/.ssh/known_hosts").expanduser()


def test_known_hosts_from_ssh_config(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host 10.0.0.*\n    UserKnownHostsFile {tmp_path}/kh other\n")
    r = SshRunner(Host(name="n", address="10.0.0.1"), SshOptions(ssh_config_path=str(config)))
    assert r.known_hosts == tmp_path / "kh"


# ------------------------------------------------------------------ error translation


def failing_open(r: SshRunner, error: BaseException) -> None:
    def raise_it() -> paramiko.Transport:
        raise error

    r._open_transport = raise_it  # type: ignore[method-assign]


ECDSA = paramiko.ECDSAKey.generate()
OTHER = paramiko.ECDSAKey.generate()


@pytest.mark.parametrize(
    ("error", "expected", "words"),
    [
        (
            paramiko.ssh_exception.NoValidConnectionsError(
                {("10.0.0.7", 22): ConnectionRefusedError(111, "Connection refused")}
            ),
            SshConnectError,
            "Connection refused",
        ),
        (ConnectionResetError(104, "Connection reset by peer"), SshConnectError, "reset"),
        (TimeoutError("timed out"), SshConnectError, "timed out after 10s"),
        (socket.gaierror(-2, "Name or service not known"), SshResolveError, "cannot resolve"),
        (
            paramiko.AuthenticationException("Authentication failed."),
            SshAuthError,
            "authorized_keys",
        ),
        (paramiko.SSHException("Error reading SSH protocol banner"), SshConnectError, "banner"),
        (EOFError(), SshConnectError, "connection lost"),
        (
            paramiko.SSHException("Incompatible ssh peer (no acceptable kex algorithm)"),
            SshProtocolError,
            "kex",
        ),
        (
            paramiko.ChannelException(1, "Administratively prohibited"),
            SshProtocolError,
            "MaxSessions",
        ),
    ],
)
def test_library_errors_become_ssh_errors(
    tmp_path: Path, error: BaseException, expected: type[SshError], words: str
) -> None:
    r = runner(tmp_path)
    failing_open(r, error)
    with pytest.raises(expected) as raised:
        r.run(["true"])
    assert type(raised.value) is expected
    assert raised.value.__cause__ is error
    text = str(raised.value)
    assert text.startswith("node gpu-1 (root@10.0.0.7:22): ")
    assert words in text
    assert isinstance(raised.value, TransientError) is (expected is SshConnectError)


def test_an_unknown_host_key_says_how_to_add_it(tmp_path: Path) -> None:
    r = runner(tmp_path, port=2222)
    failing_open(r, UnknownHostKey("[10.0.0.7]:2222", ECDSA))
    with pytest.raises(HostKeyUnknown) as raised:
        r.run(["true"])
    text = str(raised.value)
    assert "gpu-1" in text and "root@10.0.0.7:2222" in text
    assert ECDSA.fingerprint in text
    assert f"ssh-keyscan -p 2222 10.0.0.7 >> {tmp_path / 'known_hosts'}" in text
    assert "--accept-new-host-keys" in text
    assert not isinstance(raised.value, TransientError)


def test_a_changed_host_key_names_both_keys(tmp_path: Path) -> None:
    r = runner(tmp_path)
    failing_open(r, paramiko.BadHostKeyException("10.0.0.7", ECDSA, OTHER))
    with pytest.raises(HostKeyMismatch) as raised:
        r.run(["true"])
    text = str(raised.value)
    assert "HOST KEY CHANGED" in text and "gpu-1" in text
    assert ECDSA.fingerprint in text and OTHER.fingerprint in text
    assert "ssh-keygen -R '10.0.0.7'" in text


# ------------------------------------------------------------------ host key policy


def test_the_strict_policy_refuses_unknown_keys(tmp_path: Path) -> None:
    policy = HostKeyPolicy(tmp_path / "kh", accept_new=False)
    with pytest.raises(UnknownHostKey):
        policy.missing_host_key(paramiko.SSHClient(), "10.0.0.7", ECDSA)
    assert not (tmp_path / "kh").exists()


def test_accepting_new_keys_appends_them(tmp_path: Path) -> None:
    known_hosts = tmp_path / "ssh" / "known_hosts"
    client = paramiko.SSHClient()
    policy = HostKeyPolicy(known_hosts, accept_new=True)
    policy.missing_host_key(client, "[10.0.0.7]:2222", ECDSA)
    policy.missing_host_key(client, "10.0.0.8", OTHER)
    keys = paramiko.HostKeys(str(known_hosts))
    assert keys.lookup("[10.0.0.7]:2222")[ECDSA.get_name()] == ECDSA
    assert keys.lookup("10.0.0.8")[OTHER.get_name()] == OTHER
    assert client.get_host_keys().lookup("10.0.0.8") is not None
    assert known_hosts.stat().st_mode & 0o777 == 0o600


def pin(path: Path, entry: str, key: paramiko.PKey) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(f"{entry} {key.get_name()} {key.get_base64()}\n")
    return path


def test_every_known_hosts_file_of_ssh_config_and_the_system_pins(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host 10.0.0.*\n    UserKnownHostsFile {tmp_path}/kh {tmp_path}/team_kh\n"
        f"    GlobalKnownHostsFile {tmp_path}/global_kh\n"
    )
    r = SshRunner(Host(name="n", address="10.0.0.1"), SshOptions(ssh_config_path=str(config)))
    assert r.pinning_files == (tmp_path / "kh", tmp_path / "team_kh", tmp_path / "global_kh")
    inventory = tmp_path / "inventory_kh"
    r = SshRunner(
        Host(name="n", address="10.0.0.1", known_hosts=str(inventory)),
        SshOptions(ssh_config_path=str(config)),
    )
    assert r.pinning_files[0] == inventory and tmp_path / "team_kh" in r.pinning_files
    r = SshRunner(Host(name="n", address="10.0.0.1"), NO_SSH_CONFIG)
    assert Path("/etc/ssh/ssh_known_hosts") in r.pinning_files  # ssh's default


def test_a_key_pinned_in_another_file_is_known(tmp_path: Path) -> None:
    team = pin(tmp_path / "team_kh", "[10.0.0.7]:2222", ECDSA)
    client = paramiko.SSHClient()
    KnownHostsBook().pin(client, "[10.0.0.7]:2222", tmp_path / "kh", [tmp_path / "kh", team])
    assert client.get_host_keys().lookup("[10.0.0.7]:2222")[ECDSA.get_name()] == ECDSA


def test_accepting_new_keys_never_adds_a_second_key_for_a_pinned_host(tmp_path: Path) -> None:
    known_hosts = tmp_path / "kh"
    team = pin(tmp_path / "team_kh", "[10.0.0.7]:2222", ECDSA)
    policy = HostKeyPolicy(known_hosts, accept_new=True, pinned=[known_hosts, team])
    with pytest.raises(paramiko.BadHostKeyException) as raised:
        policy.missing_host_key(paramiko.SSHClient(), "[10.0.0.7]:2222", OTHER)
    assert raised.value.hostname == "10.0.0.7" and raised.value.expected_key == ECDSA
    policy.missing_host_key(paramiko.SSHClient(), "[10.0.0.7]:2222", ECDSA)  # the pinned key
    assert not known_hosts.exists()
    # the same key accepted twice (a jump host shared by two nodes) is recorded once
    policy.missing_host_key(paramiko.SSHClient(), "10.0.0.9", OTHER)
    policy.missing_host_key(paramiko.SSHClient(), "10.0.0.9", OTHER)
    assert known_hosts.read_text().count("10.0.0.9") == 1


def test_a_changed_key_names_the_file_that_pins_it(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    team = pin(tmp_path / "team_kh", "10.0.0.7", OTHER)
    config.write_text(f"Host *\n    UserKnownHostsFile {tmp_path}/kh {team}\n")
    r = SshRunner(Host(name="gpu-1", address="10.0.0.7"), SshOptions(ssh_config_path=str(config)))
    failing_open(r, paramiko.BadHostKeyException("10.0.0.7", ECDSA, OTHER))
    with pytest.raises(HostKeyMismatch) as raised:
        r.run(["true"])
    assert raised.value.known_hosts == str(team)


# ------------------------------------------------------------------ key files


def test_a_missing_key_file_is_an_auth_error(tmp_path: Path) -> None:
    r = runner(tmp_path, key_file=str(tmp_path / "absent"))
    with pytest.raises(SshAuthError, match="does not exist"):
        r.run(["true"])


def test_an_unreadable_key_file_is_an_auth_error(tmp_path: Path) -> None:
    junk = tmp_path / "id_junk"
    junk.write_text("not a key\n")
    with pytest.raises(SshAuthError, match="cannot read key file"):
        runner(tmp_path, key_file=str(junk)).run(["true"])
