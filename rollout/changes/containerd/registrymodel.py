"""`registry:` a registry mirror or settings for one host (containerd hosts.toml)."""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Mapping
from enum import Enum
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from rollout.changes.model import ChangeModel, RawChanges
from rollout.containerd.files import CONTAINERD_DIR
from rollout.containerd.hosts import DEFAULT_NAMESPACE
from rollout.errors import InputError
from rollout.inputs.fieldproblems import FieldProblem, describe_value, format_path
from rollout.inputs.fieldtypes import AbsolutePath, Bool, SpecModel, Str
from rollout.inputs.wholenumber import whole_number
from rollout.inputs.yamlsource import SourceDocument
from rollout.plan import Advertised

DEFAULT_CERTS_DIR = f"{CONTAINERD_DIR}/certs.d"
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$"
)


class Capability(Enum):
    """What containerd may do with a registry host (hosts.toml `capabilities`)."""

    PULL = "pull"
    RESOLVE = "resolve"
    PUSH = "push"


def _host_problem(host: str, port: str | None) -> str | None:
    """Why host[:port] is not usable as a registry address, or None."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else None
    if bare is not None:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            return f"{host!r} is not an IPv6 address"
    elif not _HOSTNAME.match(host):
        return f"{host!r} is not a host name or IP address"
    if port is not None and not 1 <= (whole_number(port) or 0) <= 65535:
        return f"port {port!r} is not a number from 1 to 65535"
    return None


def _split_host_port(text: str) -> tuple[str, str | None]:
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :] if end >= 0 else ""
        return text[: end + 1], (rest[1:] if rest.startswith(":") else None)
    host, colon, port = text.partition(":")
    return host, (port if colon else None)


def check_registry_host(value: str) -> str:
    """`host[:port]` as containerd names a hosts.toml directory, or `_default`."""
    if value == DEFAULT_NAMESPACE:
        return value
    if "://" in value:
        raise FieldProblem(
            f"expected host[:port] without a scheme, found {describe_value(value)}",
            hint=f"write {value.split('://', 1)[1].rstrip('/')!r}",
        )
    if "/" in value:
        raise FieldProblem(
            f"expected host[:port] without a path, found {describe_value(value)}",
            hint="containerd configures mirrors per registry host; paths belong in endpoint urls",
        )
    problem = _host_problem(*_split_host_port(value))
    if problem:
        raise FieldProblem(f'expected host[:port] or "_default": {problem}')
    return value


def check_url(value: str) -> str:
    """An http:// or https:// URL with a valid host and port, no query or fragment."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise FieldProblem(
            f"expected an http:// or https:// URL, found {describe_value(value)}",
            hint="urls start with https:// (or http:// for a plain-HTTP mirror)",
        )
    if not parts.netloc or parts.query or parts.fragment or "@" in parts.netloc:
        raise FieldProblem(
            f"expected scheme://host[:port][/path] without user, query or fragment,"
            f" found {describe_value(value)}"
        )
    problem = _host_problem(*_split_host_port(parts.netloc))
    if problem:
        raise FieldProblem(f"bad URL {value!r}: {problem}")
    return value


def is_under(path: str, directory: str) -> bool:
    """True when the absolute `path` is `directory` or inside it, after normalising."""
    normal = posixpath.normpath(path)
    return normal == directory or normal.startswith(directory.rstrip("/") + "/")


def _check_capabilities(value: tuple[Capability, ...]) -> tuple[Capability, ...]:
    for index, capability in enumerate(value):
        if capability in value[:index]:
            raise FieldProblem(f"capability {capability.value!r} is listed twice", at=(index,))
    return value


def check_config_path(value: str) -> str:
    """containerd's `registry.config_path`: a normalised directory path, one line."""
    control = any(c < " " or c == "\x7f" for c in value)
    if control or posixpath.normpath(value) != value:
        raise FieldProblem(
            "expected a normalised absolute directory (no '//', '/./', trailing '/' or control"
            f" characters), found {describe_value(value)}",
            hint=None if control else f"write {posixpath.normpath(value)!r}",
        )
    return value


class RegistryEndpoint(SpecModel):
    """One mirror of a registry host, tried in list order."""

    url: Annotated[Str, AfterValidator(check_url)]
    capabilities: Annotated[
        tuple[Capability, ...], Field(min_length=1), AfterValidator(_check_capabilities)
    ] = (Capability.PULL, Capability.RESOLVE)
    skip_verify: Bool = False
    ca_file: AbsolutePath | None = None

    @property
    def plain_http(self) -> bool:
        """An http:// endpoint: containerd must be told it speaks plain HTTP."""
        return urlsplit(self.url).scheme == "http"


class RegistryChange(ChangeModel):
    """Mirrors for one registry host, written as `<config_path>/<host>/hosts.toml`."""

    host: Annotated[Str, AfterValidator(check_registry_host)]
    endpoints: Annotated[tuple[RegistryEndpoint, ...], Field(min_length=1)]
    server: Annotated[Str, AfterValidator(check_url)] | None = None
    config_path: Annotated[AbsolutePath, AfterValidator(check_config_path)] = DEFAULT_CERTS_DIR
    # config_path and ca_file stay under /etc/containerd unless the plan says otherwise, so a
    # typo cannot drop files into /etc/cron.d or /root/.ssh
    allow_paths_outside: Bool = False

    @model_validator(mode="after")
    def _check_paths_inside(self) -> RegistryChange:
        if self.allow_paths_outside:
            return self
        named: list[tuple[tuple[str | int, ...], str]] = [(("config_path",), self.config_path)]
        for index, endpoint in enumerate(self.endpoints):
            if endpoint.ca_file is not None:
                named.append((("endpoints", index, "ca_file"), endpoint.ca_file))
        for at, path in named:
            if not is_under(path, CONTAINERD_DIR):
                raise FieldProblem(
                    f"{at[-1]} {path!r} is outside {CONTAINERD_DIR}; allowed are paths under"
                    f" {CONTAINERD_DIR}",
                    hint="if the file really belongs there, add `allow_paths_outside: true`"
                    " to this registry change",
                    at=at,
                )
        return self

    @property
    def upstream(self) -> str | None:
        """The upstream `server`: as given, else https://<host>; None for `_default`."""
        if self.server is not None:
            return self.server
        return None if self.host == DEFAULT_NAMESPACE else f"https://{self.host}"

    @property
    def hosts_toml_path(self) -> str:
        """Where containerd reads this host's mirrors from on the node."""
        return f"{self.config_path.rstrip('/')}/{self.host}/hosts.toml"

    def advertises(self, now: Mapping[str, int], physical: int) -> Advertised:
        """Registry mirrors change no GPU resource: the node advertises what it does `now`."""
        return Advertised(now)

    @classmethod
    def check_across(cls, doc: SourceDocument, found: RawChanges) -> list[InputError]:
        """Each host in one registry change, and one config_path for all of them (containerd
        has one `config_path`)."""
        errors: list[InputError] = []
        first_host: dict[str, int] = {}
        config_paths: dict[str, int] = {}
        for n, (here, body) in enumerate(found):
            if not isinstance(body, dict):
                continue
            host = body.get("host")
            if isinstance(host, str):
                if host in first_host:
                    first = doc.location_of((*found[first_host[host]][0], "host"))
                    errors.append(
                        InputError(
                            doc.location_of((*here, "host")),
                            f"registry host {host!r} is configured twice (first at line"
                            f" {first.line})",
                            field=format_path((*here, "host")),
                            hint="list all its mirrors under one registry change",
                        )
                    )
                first_host.setdefault(host, n)
            path = body.get("config_path", DEFAULT_CERTS_DIR)
            if isinstance(path, str):
                config_paths.setdefault(path, n)
                if len(config_paths) > 1 and config_paths[path] == n:
                    errors.append(
                        InputError(
                            doc.location_of((*here, "config_path")),
                            f"config_path {path!r} differs from another registry change's",
                            field=format_path((*here, "config_path")),
                            hint="containerd reads hosts.toml from one config_path; use the same"
                            " one in every registry change",
                        )
                    )
        return errors
