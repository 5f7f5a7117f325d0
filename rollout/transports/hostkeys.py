"""Strict host key checking for SSH: known_hosts decides; a new key only when asked for."""

from __future__ import annotations

import os
import threading
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
    be accepted here.
    """

    def __init__(self, known_hosts: Path, accept_new: bool) -> None:
        self._known_hosts = known_hosts
        self._accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        if not self._accept_new:
            raise UnknownHostKey(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        append_known_host(self._known_hosts, hostname, key.get_name(), key.get_base64())


def append_known_host(known_hosts: Path, entry: str, key_type: str, key_base64: str) -> None:
    """Append one `entry type key` line to known_hosts, creating the file (0600) if needed."""
    with _known_hosts_lock:
        known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as out:
            out.write(f"{entry} {key_type} {key_base64}\n")
