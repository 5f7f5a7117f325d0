# long module: one job, the SSH session to a node: connect, pin host keys, run, translate errors
"""Run commands on nodes over SSH (fabric for config and gateways, paramiko for the session).

One connection per node, opened on first use and reused for every command. Host keys are
checked strictly against known_hosts: an unknown key is an error unless the caller asked
to accept new keys, and a changed key is always an error. paramiko, fabric and socket
errors are translated here into rollout.transports.errors.

Each command runs under coreutils `timeout` on the node, so a command that runs past its
time is killed there (with its process group), not merely abandoned with the channel:
sshd does not kill a command whose channel closes, it leaves it running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fabric
import paramiko

from rollout.closeable import Closeable
from rollout.commands import CommandResult, CommandTimeout
from rollout.retry import REQUEST_POLICY, call_with_policy, is_transient
from rollout.transports.errors import (
    HostKeyMismatch,
    HostKeyUnknown,
    SshAuthError,
    SshConnectError,
    SshError,
    SshProtocolError,
    SshResolveError,
    known_hosts_entry,
)
from rollout.transports.hostkeys import (
    HostKeyPolicy,
    KnownHostsBook,
    UnknownHostKey,
    pinned_keys,
)
from rollout.transports.idempotence import Idempotence, classify_command
from rollout.transports.runner import ArgvRunner
from rollout.transports.sshchannel import exchange

if TYPE_CHECKING:
    # typing only: the inventory (an input model, above the transports) is not loaded by them
    from rollout.inventory import Host

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
# ssh's GlobalKnownHostsFile when ssh_config names none
DEFAULT_GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# How long a node that accepted the TCP connection has to complete the SSH handshake
# (banner, key exchange); one that does not is given up on, not retried.
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
# How long `timeout` waits after TERM before it sends KILL.
KILL_AFTER_S = 5.0
# Beyond the remote kill, how long to wait for the node to report before giving up on it.
REPORT_SLACK_S = 5.0
# Exit codes of `timeout` when it stopped the command (TERM, or KILL after KILL_AFTER_S).
TIMEOUT_EXIT_CODES = frozenset({124, 128 + 9})
# paramiko's exit code when the channel closed without an exit status (killed by a signal).
NO_EXIT_STATUS = -1

# paramiko logs every failed handshake from its transport thread; rollout reports the
# translated error itself, so without a handler of the user's these would print twice.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass(frozen=True)
class SshOptions:
    """Connection settings shared by every node of a run."""

    accept_new_host_keys: bool = False
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    # An ssh_config file to read instead of /etc/ssh/ssh_config and ~/.ssh/config
    # (as `ssh -F`); None reads those two, as ssh does.
    ssh_config_path: str | None = None


class SshRunner(ArgvRunner, Closeable):
    """A CommandRunner for one inventory host over SSH; one connection, reused.

    Not for concurrent use from several threads (run_on_nodes gives each node one thread);
    a lock makes such use safe but serial.
    """

    def __init__(
        self,
        host: Host,
        options: SshOptions | None = None,
        known_hosts_book: KnownHostsBook | None = None,
    ) -> None:
        """`known_hosts_book`: the fleet's parsed known_hosts files, shared by its runners
        (one of the runner's own when None)."""
        self._host = host
        self._options = options or SshOptions()
        self._book = known_hosts_book or KnownHostsBook()
        self._lock = threading.RLock()
        self._connection: fabric.Connection | None = None
        self._known_hosts: Path | None = None
        self._pinning_files: tuple[Path, ...] | None = None
        self._fabric_config: fabric.Config | None = None

    # ------------------------------------------------------------------ identity

    @property
    def host(self) -> str:
        """The Kubernetes node name, as CommandResult.host and messages show it."""
        return self._host.name

    @property
    def target(self) -> str:
        """`user@address:port` as given in the inventory."""
        address = self._host.address
        if ":" in address:
            address = f"[{address}]"
        return f"{self._host.user}@{address}:{self._host.port}"

    @property
    def known_hosts(self) -> Path:
        """The known_hosts file checked (and appended to, when accepting new keys)."""
        if self._known_hosts is None:
            self._known_hosts = self._choose_known_hosts()
        return self._known_hosts

    @property
    def pinning_files(self) -> tuple[Path, ...]:
        """Every known_hosts file whose key for a host is binding: `known_hosts`, each
        UserKnownHostsFile of ssh_config and the system's GlobalKnownHostsFile."""
        if self._pinning_files is None:
            options = self._config().base_ssh_config.lookup(self._host.address)
            named = [
                *_file_list(options.get("userknownhostsfile")),
                *_file_list(options.get("globalknownhostsfile") or DEFAULT_GLOBAL_KNOWN_HOSTS),
            ]
            files = [self.known_hosts]
            files.extend(p for p in named if p not in files)
            self._pinning_files = tuple(files)
        return self._pinning_files

    @property
    def route(self) -> str:
        """How the node is reached after ssh_config: `user@host:port via user@jump:port`."""
        if self._connection is None:
            self._connection = self._make_connection()
        hops: list[str] = []
        hop: object = self._connection
        while isinstance(hop, fabric.Connection):
            hops.append(f"{hop.user}@{hop.host}:{hop.port}")
            hop = hop.gateway
        if isinstance(hop, str):
            hops.append(f"ProxyCommand {hop}")
        return " via ".join(hops)

    def __repr__(self) -> str:
        return f"SshRunner({self.host} {self.target})"

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Connect now (commands connect on first use anyway); errors as for run()."""
        with self._lock, self._translate_errors():
            self._open_transport()

    def close(self) -> None:
        """Close the connection (and its gateways); a later command reconnects."""
        with self._lock:
            connection, self._connection = self._connection, None
            if connection is None:
                return
            gateway = connection.gateway
            connection.close()
            while isinstance(gateway, fabric.Connection):
                gateway.close()
                gateway = gateway.gateway

    @property
    def transport_id(self) -> int | None:
        """Identity of the live SSH transport (tests use it to prove the connection is reused)."""
        connection = self._connection
        if connection is None or connection.transport is None:
            return None
        return id(connection.transport)

    # ------------------------------------------------------------------ commands

    def command_line(self, argv: Sequence[str], timeout_s: float) -> str:
        """The one string sent to the node: argv quoted, under `timeout` (and sudo)."""
        if not argv:
            raise ValueError("an empty argv runs nothing")
        wrapped = [
            "timeout",
            f"--kill-after={KILL_AFTER_S:g}s",
            f"{max(timeout_s, 0.001):.3f}s",
            *argv,
        ]
        if self._host.become and self._host.user != "root":
            # -n: fail instead of prompting for a password nobody can type.
            wrapped = ["sudo", "-n", "--", *wrapped]
        return shlex.join(wrapped)

    def run_argv(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float
    ) -> CommandResult:
        """Run argv on the node; the result even for a non-zero exit.

        A command that only reads (rollout.transports.idempotence) is run again, on a new
        connection, when the connection drops; any other raises the SshConnectError for its
        step to re-check the node and decide. Raises CommandTimeout when the command ran past
        timeout_s (it is killed on the node), and an SshError when the node could not be
        reached or the session failed.
        """
        if classify_command(argv) is not Idempotence.IDEMPOTENT:
            return self._run_once(argv, stdin, timeout_s)
        return call_with_policy(
            lambda: self._run_once(argv, stdin, timeout_s),
            REQUEST_POLICY,
            operation=f"{self.host}: {shlex.join(argv)[:60]}",
            retry_on=lambda error: isinstance(error, SshConnectError) and is_transient(error),
            final=True,
        )

    def _run_once(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float
    ) -> CommandResult:
        command = self.command_line(argv, timeout_s)
        with self._lock, self._translate_errors():
            transport = self._open_transport()
            started = time.monotonic()
            channel = transport.open_session(timeout=self._options.connect_timeout_s)
            try:
                channel.exec_command(command)
                exchanged = exchange(
                    channel, stdin, started + timeout_s + KILL_AFTER_S + REPORT_SLACK_S
                )
            finally:
                channel.close()
        elapsed = time.monotonic() - started
        if exchanged is None:
            # the node did not even report the kill: the connection is suspect, start afresh
            self.close()
            raise CommandTimeout(argv, self.host, timeout_s)
        exit_code, stdout, stderr = exchanged
        if exit_code == NO_EXIT_STATUS and not transport.is_active():
            self.close()
            raise SshConnectError(
                self.host, self.target, f"connection lost while running `{shlex.join(argv)}`"
            )
        if elapsed >= timeout_s and (exit_code in TIMEOUT_EXIT_CODES or exit_code < 0):
            raise CommandTimeout(argv, self.host, timeout_s)
        return CommandResult(
            argv=argv,
            # like ssh(1): 255 when the command left no exit status (killed by a signal)
            exit_code=255 if exit_code == NO_EXIT_STATUS else exit_code,
            stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr.decode("utf-8", "replace"),
            host=self.host,
        )

    # ------------------------------------------------------------------ internals

    def _choose_known_hosts(self) -> Path:
        if self._host.known_hosts:
            return Path(self._host.known_hosts).expanduser()
        files = self._config().base_ssh_config.lookup(self._host.address).get("userknownhostsfile")
        first = files.split()[0] if isinstance(files, str) and files.strip() else None
        return Path(first or DEFAULT_KNOWN_HOSTS).expanduser()

    def _config(self) -> fabric.Config:
        """fabric's config with the ssh_config files read (once per runner)."""
        if self._fabric_config is None:
            if self._options.ssh_config_path is not None:
                self._fabric_config = fabric.Config(runtime_ssh_path=self._options.ssh_config_path)
            else:
                self._fabric_config = fabric.Config()
        return self._fabric_config

    def _make_connection(self) -> fabric.Connection:
        connect_kwargs: dict[str, Any] = {
            # paramiko's own waits for the banner and for auth, not only the TCP connect
            "banner_timeout": self._options.handshake_timeout_s,
            "auth_timeout": self._options.connect_timeout_s,
        }
        if self._host.key_file:
            # loaded here rather than by paramiko, so a missing or unreadable key file is
            # reported as such, not as a failed connection or a protocol error
            connect_kwargs["pkey"] = self._load_key(os.path.expanduser(self._host.key_file))
        connection = fabric.Connection(
            host=self._host.address,
            user=self._host.user,
            port=self._host.port,
            config=self._config(),
            connect_timeout=max(1, round(self._options.connect_timeout_s)),
            connect_kwargs=connect_kwargs,
        )
        # fabric trusts any host key (AutoAddPolicy) and reads no known_hosts; put strict
        # checking on the node and on every jump host of a ProxyJump chain.
        hop: object = connection
        while isinstance(hop, fabric.Connection):
            self._harden(hop)
            hop = hop.gateway
        return connection

    def _load_key(self, path: str) -> paramiko.PKey:
        """The inventory's key (and its `-cert.pub` certificate, when there is one)."""
        try:
            return paramiko.PKey.from_path(path)
        except FileNotFoundError as exc:
            problem, hint = f"key file {path} does not exist", "fix key_file in the inventory"
            raise SshAuthError(self.host, self.target, problem, hint=hint) from exc
        except paramiko.PasswordRequiredException as exc:
            raise SshAuthError(
                self.host,
                self.target,
                f"key file {path} is encrypted",
                hint="add the key to ssh-agent and leave key_file unset for this node",
            ) from exc
        except (OSError, ValueError, TypeError, paramiko.SSHException) as exc:
            raise SshAuthError(
                self.host,
                self.target,
                f"cannot read key file {path}: {exc}",
                hint="use an OpenSSH private key (ssh-keygen -t ed25519)",
            ) from exc

    def _harden(self, hop: fabric.Connection) -> None:
        known_hosts, pinning = self.known_hosts, self.pinning_files
        client = hop.client
        self._book.pin(client, known_hosts_entry(hop.host, int(hop.port)), known_hosts, pinning)
        client.set_missing_host_key_policy(
            HostKeyPolicy(known_hosts, self._options.accept_new_host_keys, pinning)
        )

    def _open_transport(self) -> paramiko.Transport:
        if self._connection is None:
            self._connection = self._make_connection()
        connection = self._connection
        if not connection.is_connected:
            started = time.monotonic()
            try:
                connection.open()
            except BaseException as exc:
                # a half-open client must not be mistaken for a connection next time
                self.close()
                if isinstance(exc, paramiko.SSHException | EOFError) and (
                    time.monotonic() - started >= self._options.handshake_timeout_s
                ):
                    raise self._silent_node(exc) from exc
                raise
        return connection.transport

    def _silent_node(self, exc: BaseException) -> SshConnectError:
        """A node that took the connection and never completed the handshake (a hung sshd,
        another service on the port): final, so no retry holds a worker for a minute more."""
        error = SshConnectError(
            self.host,
            self.target,
            f"no SSH handshake within {self._options.handshake_timeout_s:g}s "
            f"(the port accepts connections): {_describe(exc)}",
            hint="check that sshd on the node answers (ssh -v) and that the port is sshd's",
        )
        error.final = True
        return error

    def _port_of(self, hostname: str) -> int:
        """The port paramiko connected to for `hostname`: the node's, or a jump host's."""
        hop: object = self._connection
        while isinstance(hop, fabric.Connection):
            if hop.host == hostname:
                return int(hop.port)
            hop = hop.gateway
        return self._host.port

    def _pinned_in(self, entry: str) -> str:
        """The file that pins `entry` (the one to fix after a reinstall), else known_hosts."""
        try:
            found = pinned_keys(self.pinning_files, entry)
        except (OSError, paramiko.SSHException):
            found = []
        return str(found[0][0]) if found else str(self.known_hosts)

    @contextlib.contextmanager
    def _translate_errors(self) -> Iterator[None]:
        """paramiko, fabric and socket errors -> rollout's SshError tree, cause chained."""
        try:
            yield
        except UnknownHostKey as exc:
            raise HostKeyUnknown(
                self.host,
                self.target,
                str(self.known_hosts),
                exc.entry,
                exc.key.get_name(),
                exc.key.fingerprint,
            ) from exc
        except paramiko.BadHostKeyException as exc:
            # paramiko names the host without its port; known_hosts keys it by both
            entry = known_hosts_entry(exc.hostname, self._port_of(exc.hostname))
            raise HostKeyMismatch(
                self.host,
                self.target,
                self._pinned_in(entry),
                entry,
                exc.key.get_name(),
                exc.key.fingerprint,
                exc.expected_key.fingerprint,
            ) from exc
        except paramiko.AuthenticationException as exc:
            key = f"key {self._host.key_file}" if self._host.key_file else "the keys offered"
            raise self._error(
                SshAuthError,
                f"authentication failed: {exc}",
                f"check the user ({self._host.user}) and that {key} (or one in "
                "ssh-agent) is in the user's authorized_keys on the node",
            ) from exc
        except paramiko.ChannelException as exc:
            problem = f"the node refused a session channel: {exc}"
            hint = "check MaxSessions in the node's sshd_config"
            raise self._error(SshProtocolError, problem, hint) from exc
        except socket.gaierror as exc:
            problem = f"cannot resolve {self._host.address}: {exc.strerror or exc}"
            hint = "check the node's address in the inventory (or HostName in ssh_config)"
            raise self._error(SshResolveError, problem, hint) from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # the connection is suspect: the next command reconnects
            self.close()
            raise self._connection_error(exc) from exc

    def _connection_error(self, exc: BaseException) -> SshError:
        """A dropped or refused connection (transient), or a real SSH protocol failure."""
        if isinstance(exc, paramiko.SSHException | EOFError):
            if _is_protocol_failure(exc):
                return self._error(SshProtocolError, f"SSH failed: {exc}")
            return self._error(SshConnectError, f"connection lost: {_describe(exc)}")
        if isinstance(exc, TimeoutError):
            return self._error(
                SshConnectError,
                f"timed out after {self._options.connect_timeout_s:g}s",
                "check that the node is up and its SSH port is reachable from here",
            )
        # NoValidConnectionsError (refused on every address), resets, unreachable nets
        return self._error(
            SshConnectError,
            f"cannot connect: {_describe(exc)}",
            "check that the node is up and sshd listens on that port",
        )

    def _error(self, kind: type[SshError], problem: str, hint: str | None = None) -> SshError:
        return kind(self.host, self.target, problem, hint=hint)


def _file_list(value: object) -> list[Path]:
    """The files of a `UserKnownHostsFile a b` option (`none`: no file)."""
    if not isinstance(value, str):
        return []
    return [Path(word).expanduser() for word in value.split() if word.lower() != "none"]


def _is_protocol_failure(exc: BaseException) -> bool:
    """SSHException covers both dropped connections and real protocol failures."""
    text = str(exc).lower()
    dropped = (
        "banner",
        "not active",
        "no existing session",
        "closed",
        "eof",
        "reset",
        "timeout",
        "timed out",
    )
    return isinstance(exc, paramiko.SSHException) and not any(w in text for w in dropped)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = sorted({e.strerror or str(e) for e in exc.errors.values()})
        return "; ".join(reasons) or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
