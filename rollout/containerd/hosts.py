"""Registry host configs: `certs.d/<host[:port]>/hosts.toml`, as containerd docs/hosts.md says.

The directory is the registry host namespace: the host name or IP address and an optional
port (`myregistry.io:5000`), or `_default` for every registry without its own directory.
Hosts are tried in the order listed, `server` last. An `http://` endpoint is plain HTTP.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import tomli_w

from rollout.containerd.errors import ContainerdConfigError
from rollout.errors import BadInput

DEFAULT_NAMESPACE = "_default"
CAPABILITIES = ("pull", "resolve", "push")
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


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HostsConfigError(f"{url!r}: an endpoint needs http:// or https:// and a host")
