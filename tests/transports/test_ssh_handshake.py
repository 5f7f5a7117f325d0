"""A node whose port takes connections but never speaks SSH is given up on once, after the
handshake timeout: not retried for a minute while it holds a worker. And the fleet options
that size and bound gathering (--parallel, --handshake-timeout)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.cli import build_parser
from rollout.cli.plan import DEFAULT_PARALLEL
from rollout.inventory import Host
from rollout.transports.errors import SshConnectError
from rollout.transports.ssh import DEFAULT_HANDSHAKE_TIMEOUT_S, SshOptions, SshRunner


@pytest.fixture
def silent_port() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback port that accepts connections and never sends a byte; the connections."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1], accepted
    listener.close()
    for conn in accepted:
        conn.close()


def test_a_node_that_never_sends_a_banner_is_tried_once(
    tmp_path: Path, silent_port: tuple[int, list[socket.socket]]
) -> None:
    port, accepted = silent_port
    host = Host(name="n", address="127.0.0.1", port=port, known_hosts=str(tmp_path / "kh"))
    options = SshOptions(ssh_config_path="/dev/null", handshake_timeout_s=1)
    with SshRunner(host, options) as runner, pytest.raises(SshConnectError) as raised:
        runner.run_argv(("cat", "/etc/os-release"), None, 30)
    assert "no SSH handshake within 1s" in str(raised.value)
    assert raised.value.final  # no outer policy retries it either
    assert len(accepted) == 1  # one connection: the read-only command was not retried


def test_parallel_and_handshake_timeout_defaults() -> None:
    for command in ("plan", "apply", "diagnose"):
        args = build_parser([command]).parse_args([command, "p.yaml", "-i", "inv"])
        assert args.parallel == DEFAULT_PARALLEL == 32
        assert args.handshake_timeout is None  # SshOptions' default then
    assert DEFAULT_HANDSHAKE_TIMEOUT_S == 10
    parser = build_parser(["plan"])
    args = parser.parse_args(["plan", "p.yaml", "-i", "inv", "--handshake-timeout", "2.5"])
    assert args.handshake_timeout == 2.5
    for bad in ("0", "301", "soon"):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["plan", "p.yaml", "-i", "inv", "--handshake-timeout", bad])
        assert exited.value.code == 2
