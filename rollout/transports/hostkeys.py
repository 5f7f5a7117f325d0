"""Strict host key checking for SSH: known_hosts decides; a new key only when asked for.

A host counts as known when any known_hosts file ssh itself would read pins it: the one
rollout appends to, every UserKnownHostsFile of ssh_config, and the system's
GlobalKnownHostsFile. Accepting new keys never adds a second key for a host pinned anywhere.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import paramiko

_known_hosts_lock = threading.Lock()


class UnknownHostKey(paramiko.SSHException):  # type: ignore[misc]
    """Raised by the host key policy; translated into HostKeyUnknown at the boundary."""

    def __init__(self, entry: str, key: paramiko.PKey) -> None:
        self.entry = entry
        self.key = key
        super().__init__(f"unknown host key for {entry}")


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    """Unknown keys: refuse, or (when asked) append to known_hosts and accept.

    paramiko consults the policy only for a host it has no key for; a host whose recorded
    key differs fails in paramiko itself (BadHostKeyException), so a changed key can never
    be accepted here. The policy checks every pinning file again before it appends: a key
    another file (or another thread, for a shared jump host) recorded meanwhile wins.
    """

    def __init__(self, known_hosts: Path, accept_new: bool, pinned: Sequence[Path] = ()) -> None:
        self._known_hosts = known_hosts
        self._accept_new = accept_new
        self._pinned = tuple(pinned)

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        if not self._accept_new:
            raise UnknownHostKey(hostname, key)
        accept_known_host(self._known_hosts, self._pinned, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


def load_known_hosts(client: paramiko.SSHClient, known_hosts: Path, pinned: Sequence[Path]) -> None:
    """Every pinning file into the client: rollout's own file, then the others (read only)."""
    if known_hosts.exists():
        client.get_host_keys().load(str(known_hosts))
    for path in pinned:
        if path != known_hosts and path.exists():
            client.load_system_host_keys(str(path))


def pinned_keys(files: Sequence[Path], entry: str) -> list[tuple[Path, paramiko.PKey]]:
    """Each key recorded for `entry` (`host` or `[host]:port`), with the file recording it."""
    found: list[tuple[Path, paramiko.PKey]] = []
    for path in files:
        if not path.exists():
            continue
        keys = paramiko.HostKeys(str(path)).lookup(entry)
        if keys is not None:
            found.extend((path, keys[name]) for name in keys)
    return found


def accept_known_host(
    known_hosts: Path, pinned: Sequence[Path], entry: str, key: paramiko.PKey
) -> None:
    """Record a new host's key in `known_hosts`, unless a file already pins the host: the
    same key is accepted as it is, a different one is a mismatch (BadHostKeyException)."""
    with _known_hosts_lock:
        recorded = pinned_keys([known_hosts, *pinned], entry)
        if recorded:
            if any(other == key for _, other in recorded):
                return
            host = entry[1 : entry.index("]")] if entry.startswith("[") else entry
            raise paramiko.BadHostKeyException(host, key, recorded[0][1])
        append_known_host(known_hosts, entry, key.get_name(), key.get_base64())


def append_known_host(known_hosts: Path, entry: str, key_type: str, key_base64: str) -> None:
    """Append one `entry type key` line to known_hosts, creating the file (0600) if needed.

    The caller holds the lock (accept_known_host): checking and appending are one step.
    """
    known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as out:
        out.write(f"{entry} {key_type} {key_base64}\n")
