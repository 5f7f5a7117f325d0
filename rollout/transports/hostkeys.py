"""Strict host key checking for SSH: known_hosts decides; a new key only when asked for.

A host counts as known when any known_hosts file ssh itself would read pins it: the one
rollout appends to, every UserKnownHostsFile of ssh_config, and the system's
GlobalKnownHostsFile. Accepting new keys never adds a second key for a host pinned anywhere.
"""

from __future__ import annotations

import hmac
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

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


@dataclass(frozen=True)
class KnownHostsFile:
    """One known_hosts file, parsed: keys by host entry, and the hashed (`|1|`) lines."""

    plain: Mapping[str, tuple[paramiko.PKey, ...]] = field(default_factory=dict)
    hashed: tuple[tuple[str, paramiko.PKey], ...] = ()

    def keys_for(self, entry: str) -> list[paramiko.PKey]:
        """The keys recorded for `entry` (`host` or `[host]:port`), in file order."""
        found = list(self.plain.get(entry, ()))
        for salted, key in self.hashed:
            if hmac.compare_digest(paramiko.HostKeys.hash_host(entry, salted), salted):
                found.append(key)
        return found


def parse_known_hosts(path: Path) -> KnownHostsFile:
    """A known_hosts file indexed by host (a missing file is empty); lines paramiko cannot
    read (markers, unknown key types, bad base64) are skipped, as ssh skips them.

    paramiko's HostKeys.load checks each line against every line before it, so parsing is
    linear here and quadratic there: a 1,000-line file is parsed in milliseconds.
    """
    if not path.exists():
        return KnownHostsFile()
    plain: dict[str, list[paramiko.PKey]] = {}
    hashed: list[tuple[str, paramiko.PKey]] = []
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                entry = HostKeyEntry.from_line(line, number)
            except (paramiko.SSHException, InvalidHostKey):
                continue
            if entry is None:
                continue
            for name in entry.hostnames:
                if name.startswith("|1|"):
                    hashed.append((name, entry.key))
                else:
                    plain.setdefault(name, []).append(entry.key)
    return KnownHostsFile({name: tuple(keys) for name, keys in plain.items()}, tuple(hashed))


class KnownHostsBook:
    """Each known_hosts file parsed once, shared by every SSH client of one fleet.

    Each client is given only its own host's keys: loading every file into every client
    made gathering N nodes parse N files of N lines. Keys appended during the run
    (accepting new keys) are not seen here; the policy reads the files again before it
    appends (accept_known_host), so a key recorded meanwhile still wins.
    """

    def __init__(self, parse: Callable[[Path], KnownHostsFile] = parse_known_hosts) -> None:
        self._parse = parse
        self._lock = threading.Lock()
        self._files: dict[Path, KnownHostsFile] = {}

    def read(self, path: Path) -> KnownHostsFile:
        """`path` parsed, on first use only."""
        with self._lock:
            parsed = self._files.get(path)
            if parsed is None:
                parsed = self._files[path] = self._parse(path)
            return parsed

    def pin(
        self,
        client: paramiko.SSHClient,
        entry: str,
        known_hosts: Path,
        pinned: Sequence[Path] = (),
    ) -> None:
        """Give `client` the keys pinned for `entry`: those of the other pinning files when
        any has one (ssh's system files win over rollout's own, as paramiko checks them
        first), else those of rollout's own file."""
        others = [
            key for path in pinned if path != known_hosts for key in self.read(path).keys_for(entry)
        ]
        keys = client.get_host_keys()
        for key in others or self.read(known_hosts).keys_for(entry):
            keys.add(entry, key.get_name(), key)


def pinned_keys(files: Sequence[Path], entry: str) -> list[tuple[Path, paramiko.PKey]]:
    """Each key recorded for `entry` (`host` or `[host]:port`), with the file recording it."""
    return [(path, key) for path in files for key in parse_known_hosts(path).keys_for(entry)]


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
