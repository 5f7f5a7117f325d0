"""The fleet's known_hosts book: each file parsed once, each client given only its own
host's keys, and strict checking still refusing a wrong key (against an in-process server)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from rollout.inventory import Host
from rollout.transports.errors import HostKeyMismatch
from rollout.transports.hostkeys import KnownHostsBook, KnownHostsFile, parse_known_hosts
from rollout.transports.ssh import SshOptions, SshRunner

NO_SSH_CONFIG = SshOptions(ssh_config_path="/dev/null", connect_timeout_s=10)
KEYS = [paramiko.ECDSAKey.generate() for _ in range(3)]


class AnyKey(paramiko.ServerInterface):  # type: ignore[misc]
    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL


@pytest.fixture
def servers() -> Iterator[list[int]]:
    """Three SSH servers on loopback, server i presenting KEYS[i]; their ports."""
    listeners: list[socket.socket] = []
    transports: list[paramiko.Transport] = []

    def serve(listener: socket.socket, key: paramiko.PKey) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(key)
            transports.append(transport)
            transport.start_server(server=AnyKey())

    for key in KEYS:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)
        threading.Thread(target=serve, args=(listener, key), daemon=True).start()
    yield [listener.getsockname()[1] for listener in listeners]
    for listener in listeners:
        listener.close()
    for transport in transports:
        transport.close()


def write_known_hosts(path: Path, ports: list[int], keys: list[paramiko.PKey]) -> None:
    filler = [
        f"[10.9.{i // 250}.{i % 250}]:22 {KEYS[0].get_name()} {KEYS[0].get_base64()}"
        for i in range(200)
    ]
    mine = [
        f"[127.0.0.1]:{port} {key.get_name()} {key.get_base64()}"
        for port, key in zip(ports, keys, strict=True)
    ]
    path.write_text("\n".join(["# a comment", *filler, *mine, "@revoked * x y", ""]))


def fleet(tmp_path: Path, ports: list[int], book: KnownHostsBook) -> list[SshRunner]:
    user_key = tmp_path / "id_ecdsa"
    if not user_key.exists():
        paramiko.ECDSAKey.generate().write_private_key_file(str(user_key))
    return [
        SshRunner(
            Host(
                name=f"n{i}",
                address="127.0.0.1",
                port=port,
                user="root",
                key_file=str(user_key),
                known_hosts=str(tmp_path / "known_hosts"),
            ),
            NO_SSH_CONFIG,
            book,
        )
        for i, port in enumerate(ports)
    ]


def test_a_fleet_parses_known_hosts_once_and_each_client_gets_its_own_keys(
    tmp_path: Path, servers: list[int]
) -> None:
    write_known_hosts(tmp_path / "known_hosts", servers, KEYS)
    parsed: list[Path] = []

    def counting_parse(path: Path) -> KnownHostsFile:
        parsed.append(path)
        return parse_known_hosts(path)

    book = KnownHostsBook(parse=counting_parse)
    runners = fleet(tmp_path, servers, book)
    for runner, port, key in zip(runners, servers, KEYS, strict=True):
        with runner:
            runner.open()
            assert runner.transport_id is not None
            client = runner._connection.client  # type: ignore[union-attr]
            held = client.get_host_keys()
            # only this host's entry, not the 200 others
            assert list(held.keys()) == [f"[127.0.0.1]:{port}"]
            assert held.lookup(f"[127.0.0.1]:{port}")[key.get_name()] == key
    assert parsed.count(tmp_path / "known_hosts") == 1
    assert len(parsed) == len(set(parsed))  # every pinning file once, however many nodes


def test_strict_checking_still_refuses_a_wrong_key(tmp_path: Path, servers: list[int]) -> None:
    # the second server's entry records the third server's key
    write_known_hosts(tmp_path / "known_hosts", servers, [KEYS[0], KEYS[2], KEYS[2]])
    runners = fleet(tmp_path, servers, KnownHostsBook())
    with runners[0]:
        runners[0].open()
    with runners[1], pytest.raises(HostKeyMismatch) as raised:
        runners[1].open()
    assert raised.value.entry == f"[127.0.0.1]:{servers[1]}"


def test_hashed_entries_and_system_files_pin_too(tmp_path: Path) -> None:
    entry = "[10.0.0.7]:2222"
    own = tmp_path / "kh"
    own.write_text(f"{entry} {KEYS[0].get_name()} {KEYS[0].get_base64()}\n")
    team = tmp_path / "team_kh"
    hashed = paramiko.HostKeys.hash_host(entry)
    team.write_text(f"{hashed} {KEYS[1].get_name()} {KEYS[1].get_base64()}\n")
    assert parse_known_hosts(team).keys_for(entry) == [KEYS[1]]
    assert parse_known_hosts(tmp_path / "missing").keys_for(entry) == []
    book = KnownHostsBook()
    client = paramiko.SSHClient()
    book.pin(client, entry, own, [own, team])
    # a key in another pinning file wins over rollout's own, as paramiko reads system keys first
    assert client.get_host_keys().lookup(entry)[KEYS[1].get_name()] == KEYS[1]
    alone = paramiko.SSHClient()
    book.pin(alone, entry, own, [own])
    assert alone.get_host_keys().lookup(entry)[KEYS[0].get_name()] == KEYS[0]
