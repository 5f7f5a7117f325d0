"""Registry host configs: `certs.d/<host[:port]>/hosts.toml`, as containerd docs/hosts.md says.

The directory is the registry host namespace: the host name or IP address and an optional
port (`myregistry.io:5000`), or `_default` for every registry without its own directory.
Hosts are tried in the order listed, `server` last. An `http://` endpoint is plain HTTP.
"""

from __future__ import annotations

import posixpath
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import tomli_w

from rollout.containerd.errors import ContainerdConfigError
from rollout.errors import BadInput

DEFAULT_NAMESPACE = "_default"
CAPABILITIES = ("pull", "resolve", "push")
# what rollout decides in a hosts.toml; every other key (header, client, ca of the server,
# dial_timeout, ...) is the operator's and survives a rewrite
MANAGED_TOP_KEYS = frozenset({"server", "host"})
MANAGED_HOST_KEYS = frozenset({"capabilities", "skip_verify", "ca"})
_NAMESPACE_RE = re.compile(
    r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$|^\[[0-9a-fA-F:]+\](:[0-9]{1,5})?$"
)


class HostsConfigError(ContainerdConfigError, BadInput):
    """A registry host or endpoint that cannot go into hosts.toml."""


@dataclass(frozen=True)
class HostEndpoint:
    """One `[host."<url>"]` entry: a mirror or the registry itself."""

    url: str
    capabilities: tuple[str, ...] = ("pull", "resolve")
    skip_verify: bool = False
    ca: tuple[str, ...] = ()
    override_path: bool = False

    def __post_init__(self) -> None:
        _check_url(self.url)
        unknown = [c for c in self.capabilities if c not in CAPABILITIES]
        if unknown or not self.capabilities:
            raise HostsConfigError(
                f"{self.url}: capabilities must be some of {', '.join(CAPABILITIES)}, "
                f"got {list(self.capabilities)}"
            )

    @property
    def plain_http(self) -> bool:
        return urlsplit(self.url).scheme == "http"


def hosts_namespace(registry: str | None) -> str:
    """The certs.d directory name for a registry: `host[:port]`, or `_default` for None."""
    if registry is None or registry == DEFAULT_NAMESPACE:
        return DEFAULT_NAMESPACE
    name = registry
    if "://" in registry:
        name = urlsplit(registry).netloc
    name = name.rstrip("/")
    if not _NAMESPACE_RE.match(name):
        raise HostsConfigError(
            f"{registry!r} is not a registry host namespace (host or IP address, optional "
            ":port, e.g. registry.example.com:5000)"
        )
    return name


def hosts_toml_path(config_path: str, registry: str | None) -> str:
    """Where the hosts.toml of a registry lives under `registry.config_path`."""
    return posixpath.join(config_path, hosts_namespace(registry), "hosts.toml")


def render_hosts_toml(server: str | None, hosts: Sequence[HostEndpoint] = ()) -> str:
    """The hosts.toml text: `server` (the fallback, None: the namespace itself) and hosts."""
    if server is None and not hosts:
        raise HostsConfigError("a hosts.toml needs a server or at least one host")
    doc: dict[str, object] = {}
    if server is not None:
        _check_url(server)
        doc["server"] = server
    if hosts:
        table: dict[str, dict[str, object]] = {}
        for host in hosts:
            if host.url in table:
                raise HostsConfigError(f"host {host.url} is listed twice")
            entry: dict[str, object] = {"capabilities": list(host.capabilities)}
            if host.skip_verify:
                entry["skip_verify"] = True
            if host.ca:
                entry["ca"] = host.ca[0] if len(host.ca) == 1 else list(host.ca)
            if host.override_path:
                entry["override_path"] = True
            table[host.url] = entry
        doc["host"] = table
    return tomli_w.dumps(doc)


def merge_hosts_toml(
    existing: str | None, server: str | None, hosts: Sequence[HostEndpoint] = ()
) -> str:
    """The hosts.toml rollout writes over `existing`: its server and hosts, with every key
    rollout does not manage kept (an `Authorization` header of a mirror, client certs,
    `override_path`). `existing` itself when it already says the same, so an unchanged
    file is no write; a fresh rendering when there is nothing (readable) to keep."""
    rendered = render_hosts_toml(server, hosts)
    if existing is None:
        return rendered
    try:
        old = tomllib.loads(existing)
    except tomllib.TOMLDecodeError:
        # containerd cannot read it either: nothing in it is in effect to keep
        return rendered
    new: dict[str, Any] = tomllib.loads(rendered)
    merged: dict[str, Any] = {k: v for k, v in new.items() if k != "host"}
    merged.update({k: v for k, v in old.items() if k not in MANAGED_TOP_KEYS})
    old_hosts = old.get("host")
    if "host" in new:
        table: dict[str, Any] = {}
        for url, entry in new["host"].items():
            before = old_hosts.get(url) if isinstance(old_hosts, Mapping) else None
            table[url] = _merge_host(entry, before)
        merged["host"] = table
    if merged == old:
        return existing
    return tomli_w.dumps(merged)


def _merge_host(entry: dict[str, Any], before: Any) -> dict[str, Any]:
    if not isinstance(before, Mapping):
        return entry
    kept = {k: v for k, v in before.items() if k not in MANAGED_HOST_KEYS and k not in entry}
    return {**entry, **kept}


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HostsConfigError(f"{url!r}: an endpoint needs http:// or https:// and a host")
