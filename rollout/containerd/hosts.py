"""Registry host configs: `certs.d/<host[:port]>/hosts.toml`, as containerd docs/hosts.md says.

The directory is the registry host namespace: the host name or IP address and an optional
port (`myregistry.io:5000`), or `_default` for every registry without its own directory.
Hosts are tried in the order listed, `server` last. An `http://` endpoint is plain HTTP.
"""

from __future__ import annotations

import copy
import posixpath
import re
import tomllib
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.toml_document import TOMLDocument

from rollout.containerd.errors import ContainerdConfigError
from rollout.errors import BadInput

DEFAULT_NAMESPACE = "_default"
CAPABILITIES = ("pull", "resolve", "push")
# What rollout decides in a hosts.toml: `server` when the plan sets it, which hosts, and of
# each host its capabilities, skip_verify and ca. Every other key (header, client, ca of the
# server, dial_timeout, ...) is the operator's and survives a rewrite.
_BLANK_RUN = re.compile(r"\n{3,}")
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
    doc = tomlkit.document()
    if server is not None:
        _check_url(server)
        doc["server"] = server
    if hosts:
        table = tomlkit.table(is_super_table=True)
        for host in hosts:
            if host.url in table:
                raise HostsConfigError(f"host {host.url} is listed twice")
            entry: dict[str, object] = {"capabilities": list(host.capabilities)}
            if host.skip_verify:
                entry["skip_verify"] = True
            if host.ca:
                entry["ca"] = _ca_value(host.ca)
            if host.override_path:
                entry["override_path"] = True
            table[host.url] = entry
        doc["host"] = table
    return tomlkit.dumps(doc)


def merge_hosts_toml(
    existing: str | None,
    server: str | None,
    hosts: Sequence[HostEndpoint] = (),
    *,
    default_server: str | None = None,
) -> str:
    """The hosts.toml rollout writes over `existing`, changing only what the plan states.

    `server` is the plan's own (None: the plan does not set it, and an existing `server`
    stays; a new file gets `default_server`). The plan's hosts replace the file's, in the
    plan's order; of each host rollout decides only its capabilities, skip_verify and ca, and
    keeps every other key (an `Authorization` header of a mirror, client certs,
    `override_path`). Values the plan does not change keep their text (a one-line array, a
    comment), so a file that already says what the plan asks is returned as it is: no write.
    A fresh rendering when there is nothing (readable) to keep.
    """
    if existing is None:
        return render_hosts_toml(server if server is not None else default_server, hosts)
    try:
        old = tomllib.loads(existing)
        doc = tomlkit.parse(existing)
    except (tomllib.TOMLDecodeError, TOMLKitError):
        # containerd cannot read it either: nothing in it is in effect to keep
        return render_hosts_toml(server if server is not None else default_server, hosts)
    wanted = copy.deepcopy(old)
    _apply_plan(wanted, server, hosts)
    if _same_hosts_file(wanted, old):
        return existing
    _apply_plan(doc, server, hosts)
    edited = _tidy_blank_lines(tomlkit.dumps(doc), existing)
    if _same_hosts_file(tomllib.loads(edited), wanted):
        return edited
    # a layout the in-place edit does not reach (a table split around another): the meaning
    # is what counts, so write it out plainly
    return tomlkit.dumps(wanted)


def _apply_plan(
    doc: MutableMapping[str, Any], server: str | None, hosts: Sequence[HostEndpoint]
) -> None:
    """Make `doc` (a plain dict or a tomlkit document: one edit, two representations) say
    what the plan states."""
    if server is not None:
        _check_url(server)
        if doc.get("server") != server:
            doc["server"] = server
    urls = [host.url for host in hosts]
    if len(set(urls)) != len(urls):
        raise HostsConfigError(f"a host is listed twice in {urls}")
    table = doc.get("host")
    if not isinstance(table, MutableMapping):
        if "host" in doc:
            del doc["host"]
        if not hosts:
            return
        doc["host"] = tomlkit.table(is_super_table=True) if isinstance(doc, TOMLDocument) else {}
        table = doc["host"]
    for url in [u for u in table if u not in urls]:
        del table[url]  # a mirror the plan no longer lists goes
    for host in hosts:
        entry = table.get(host.url)
        if not isinstance(entry, MutableMapping):
            if host.url in table:
                del table[host.url]
            table[host.url] = {}
            entry = table[host.url]
        _apply_host(entry, host)
    if list(table) != urls:
        # hosts are tried in the order listed: the plan's order
        entries = {url: table[url] for url in urls}
        for url in urls:
            del table[url]
        for url in urls:
            table[url] = entries[url]


def _apply_host(entry: MutableMapping[str, Any], host: HostEndpoint) -> None:
    if entry.get("capabilities") != list(host.capabilities):
        entry["capabilities"] = list(host.capabilities)
    if host.skip_verify and entry.get("skip_verify") is not True:
        entry["skip_verify"] = True
    elif not host.skip_verify and entry.get("skip_verify", False) is not False:
        del entry["skip_verify"]
    if not host.ca:
        if "ca" in entry:
            del entry["ca"]
    elif _ca_tuple(entry.get("ca")) != host.ca:
        entry["ca"] = _ca_value(host.ca)
    if host.override_path and entry.get("override_path") is not True:
        entry["override_path"] = True


def _tidy_blank_lines(edited: str, existing: str) -> str:
    """A removed table leaves its blank lines behind: at most the runs the file had."""
    if _BLANK_RUN.search(existing):
        return edited
    return _BLANK_RUN.sub("\n\n", edited).rstrip("\n") + "\n"


def _ca_value(ca: tuple[str, ...]) -> str | list[str]:
    return ca[0] if len(ca) == 1 else list(ca)


def _ca_tuple(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(value)
    return None


def _same_hosts_file(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal in meaning: the same keys and values, and the hosts in the same order."""
    order_a = list(a["host"]) if isinstance(a.get("host"), Mapping) else None
    order_b = list(b["host"]) if isinstance(b.get("host"), Mapping) else None
    return bool(a == b) and order_a == order_b


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HostsConfigError(f"{url!r}: an endpoint needs http:// or https:// and a host")
