"""The four kinds of change a plan can make on a GPU node."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, PlainValidator, model_validator

from rollout.spec.fieldtypes import (
    AbsolutePath,
    Bool,
    DnsLabel,
    Int,
    KubeName,
    SpecModel,
    Str,
)
from rollout.spec.selector import check_label_value
from rollout.yamlsource import FieldProblem, describe_value


class ChangeKind(Enum):
    """The key that names a change in `changes:`."""

    REGISTRY = "registry"
    CONTAINERD = "containerd"
    TIME_SLICING = "time-slicing"
    DRIVER_UPGRADE = "driver-upgrade"


# ---------------------------------------------------------------- registry

DEFAULT_CERTS_DIR = "/etc/containerd/certs.d"
DEFAULT_HOST = "_default"
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
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
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
    if value == DEFAULT_HOST:
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


def _check_capabilities(value: tuple[Capability, ...]) -> tuple[Capability, ...]:
    for index, capability in enumerate(value):
        if capability in value[:index]:
            raise FieldProblem(f"capability {capability.value!r} is listed twice", at=(index,))
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


class RegistryChange(SpecModel):
    """Mirrors for one registry host, written as `<config_path>/<host>/hosts.toml`."""

    kind: ClassVar[ChangeKind] = ChangeKind.REGISTRY

    host: Annotated[Str, AfterValidator(check_registry_host)]
    endpoints: Annotated[tuple[RegistryEndpoint, ...], Field(min_length=1)]
    server: Annotated[Str, AfterValidator(check_url)] | None = None
    config_path: AbsolutePath = DEFAULT_CERTS_DIR

    @property
    def upstream(self) -> str | None:
        """The upstream `server`: as given, else https://<host>; None for `_default`."""
        if self.server is not None:
            return self.server
        return None if self.host == DEFAULT_HOST else f"https://{self.host}"

    @property
    def hosts_toml_path(self) -> str:
        """Where containerd reads this host's mirrors from on the node."""
        return f"{self.config_path.rstrip('/')}/{self.host}/hosts.toml"


# ---------------------------------------------------------------- containerd

# containerd's own table names: letters, digits, '_' and '-' (runtime names like nvidia-cdi)
_SETTING_SEGMENT = re.compile(r"^[A-Za-z0-9_-]+$")
DEFAULT_RUNTIME_KEY = "containerd.default_runtime_name"
SettingValue = str | int | float | bool | list[Any] | dict[str, Any]


def check_setting_key(key: str) -> str:
    """A dotted key relative to the CRI plugin table, e.g. `containerd.runtimes.nvidia`."""
    if key.startswith("plugins.") or key.startswith("plugins"):
        raise FieldProblem(
            f"setting {key!r} names a plugin table",
            hint="keys are relative to the CRI plugin table: write e.g. 'enable_cdi' or"
            " 'containerd.runtimes.nvidia.options.SystemdCgroup'",
        )
    segments = key.split(".")
    if not all(_SETTING_SEGMENT.match(s) for s in segments):
        raise FieldProblem(
            f"expected a dotted key of letters, digits, '_' and '-', found {describe_value(key)}"
        )
    if segments[0] == "registry":
        raise FieldProblem(
            f"setting {key!r} configures registries",
            hint="use a `registry:` change; it writes hosts.toml and sets config_path",
        )
    return key


def check_setting_value(value: Any) -> Any:
    """A value TOML can hold: strings, numbers, booleans, lists and tables of those."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        for item in value:
            check_setting_value(item)
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise FieldProblem(f"table keys must be strings, found {describe_value(key)}")
            check_setting_value(item)
        return value
    raise FieldProblem(
        f"expected a TOML value (string, number, boolean, list or table),"
        f" found {describe_value(value)}",
        hint="TOML has no null; to leave a setting as it is, leave it out"
        if value is None
        else None,
    )


SettingKey = Annotated[Str, AfterValidator(check_setting_key)]


class ContainerdChange(SpecModel):
    """Settings of containerd's CRI plugin, keys relative to its table (config version 2)."""

    kind: ClassVar[ChangeKind] = ChangeKind.CONTAINERD

    settings: Mapping[SettingKey, Annotated[Any, AfterValidator(check_setting_value)]] = Field(
        default_factory=dict
    )
    default_runtime: (
        Annotated[
            Str,
            AfterValidator(lambda v: _check_runtime_name(v)),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _check_consistent(self) -> ContainerdChange:
        if not self.settings and self.default_runtime is None:
            raise FieldProblem(
                "a containerd change needs `settings` or `default_runtime`",
                hint="remove the change if there is nothing to set",
            )
        if self.default_runtime is not None and DEFAULT_RUNTIME_KEY in self.settings:
            raise FieldProblem(
                f"`default_runtime` and the setting {DEFAULT_RUNTIME_KEY!r} both set the"
                " default runtime",
                hint="keep one of them",
            )
        for longer in sorted(self.settings):
            segments = longer.split(".")
            prefixes = (".".join(segments[:n]) for n in range(1, len(segments)))
            shorter = next((p for p in prefixes if p in self.settings), None)
            if shorter is not None:
                raise FieldProblem(
                    f"settings {shorter!r} and {longer!r} overlap",
                    hint=f"put the value of {longer!r} inside the table {shorter!r}, or split"
                    " the table into dotted keys",
                )
        return self

    def all_settings(self) -> Mapping[str, Any]:
        """All settings as dotted keys, `default_runtime` folded in."""
        merged = dict(self.settings)
        if self.default_runtime is not None:
            merged[DEFAULT_RUNTIME_KEY] = self.default_runtime
        return merged

    @staticmethod
    def split_key(key: str) -> tuple[str, ...]:
        """A dotted settings key as its table path."""
        return tuple(key.split("."))


def _check_runtime_name(value: str) -> str:
    if not _SETTING_SEGMENT.match(value):
        raise FieldProblem(
            f"expected a runtime name like 'nvidia' or 'runc', found {describe_value(value)}"
        )
    return value


# ---------------------------------------------------------------- time-slicing

MAX_REPLICAS = 64
_RESOURCE_NAME = re.compile(r"^nvidia\.com/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def check_resource_name(value: str) -> str:
    """An extended resource the device plugin advertises: nvidia.com/gpu, nvidia.com/mig-..."""
    if not _RESOURCE_NAME.match(value):
        hint = f"write 'nvidia.com/{value}'" if "/" not in value and value else None
        raise FieldProblem(
            f"expected a resource name like 'nvidia.com/gpu', found {describe_value(value)}",
            hint=hint,
        )
    return value


def check_replicas(value: int) -> int:
    """2..MAX_REPLICAS: 1 shares nothing, and more than 64 slices of one GPU is a typo."""
    if value == 1:
        raise FieldProblem(
            "replicas: 1 means no sharing",
            hint="remove the time-slicing change, or use a profile without this resource",
        )
    if not 2 <= value <= MAX_REPLICAS:
        raise FieldProblem(f"expected replicas from 2 to {MAX_REPLICAS}, found {value}")
    return value


def check_profile(value: str) -> str:
    """A ConfigMap key that is also a node label value."""
    problem = check_label_value(value)
    if problem or not value:
        raise FieldProblem(
            f"the profile is the value of the node label nvidia.com/device-plugin.config:"
            f" {problem or 'it must not be empty'}"
        )
    return value


class ConfigMapRef(SpecModel):
    """The ConfigMap whose keys are device-plugin profiles (ClusterPolicy devicePlugin.config)."""

    namespace: DnsLabel = "gpu-operator"
    name: KubeName = "time-slicing-config"


class SharedResource(SpecModel):
    """One resource shared by time-slicing."""

    name: Annotated[Str, AfterValidator(check_resource_name)]
    replicas: Annotated[Int, AfterValidator(check_replicas)]


def _check_distinct_resources(value: tuple[SharedResource, ...]) -> tuple[SharedResource, ...]:
    names = [r.name for r in value]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise FieldProblem(f"resource {name!r} is listed twice", at=(index, "name"))
    return value


class TimeSlicing(SpecModel):
    """The device plugin's `sharing.timeSlicing` block."""

    rename_by_default: Bool = Field(default=False, alias="renameByDefault")
    fail_requests_greater_than_one: Bool = Field(default=False, alias="failRequestsGreaterThanOne")
    resources: Annotated[
        tuple[SharedResource, ...], Field(min_length=1), AfterValidator(_check_distinct_resources)
    ]


class Sharing(SpecModel):
    """The device plugin's `sharing` block."""

    time_slicing: TimeSlicing = Field(alias="timeSlicing")


class DevicePluginConfig(SpecModel):
    """A device-plugin config as the GPU Operator's ConfigMap holds it under one profile key."""

    version: Literal["v1"] = "v1"
    sharing: Sharing


class TimeSlicingChange(SpecModel):
    """Put `config` under key `profile` in the ConfigMap and label nodes with the profile."""

    kind: ClassVar[ChangeKind] = ChangeKind.TIME_SLICING

    configmap: ConfigMapRef = ConfigMapRef()
    profile: Annotated[Str, AfterValidator(check_profile)]
    config: DevicePluginConfig

    def replicas_for(self, resource: str) -> int:
        """How many slices each device of `resource` becomes: 1 when it is not shared."""
        for shared in self.config.sharing.time_slicing.resources:
            if shared.name == resource:
                return shared.replicas
        return 1

    def config_document(self) -> dict[str, Any]:
        """The config as the device plugin reads it (camelCase keys), for the ConfigMap."""
        return self.config.model_dump(mode="json", by_alias=True)


# ---------------------------------------------------------------- driver-upgrade

_DRIVER_VERSION = re.compile(r"^[0-9]{3}\.[0-9]{1,3}\.[0-9]{1,3}$")
_DEB_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
DEFAULT_DRIVER_PACKAGES = ("nvidia-driver",)


class DriverMode(Enum):
    """Who installs the driver: apt on the host, or the GPU Operator's driver container."""

    HOST = "host"
    OPERATOR = "operator"


def check_driver_version(value: Any) -> str:
    """A full NVIDIA driver version such as 535.154.05, as a string."""
    if isinstance(value, float):
        raise FieldProblem(
            f'expected a driver version like "550.127.05", found the number {value!r}',
            hint="quote the version; YAML reads 550.127 as a number",
        )
    if not isinstance(value, str) or not _DRIVER_VERSION.match(value):
        raise FieldProblem(
            f'expected a driver version like "550.127.05", found {describe_value(value)}'
        )
    return value


def check_package(value: str) -> str:
    """A Debian package name, without a version pin (rollout pins `version` itself)."""
    if "=" in value:
        raise FieldProblem(
            f"expected a package name without a version, found {describe_value(value)}",
            hint="rollout installs `version`; list names only",
        )
    if not _DEB_PACKAGE.match(value):
        raise FieldProblem(f"expected a Debian package name, found {describe_value(value)}")
    return value


class DriverUpgradeChange(SpecModel):
    """Move the GPU driver to `version`, by apt (host) or through the ClusterPolicy (operator)."""

    kind: ClassVar[ChangeKind] = ChangeKind.DRIVER_UPGRADE

    version: Annotated[str, PlainValidator(check_driver_version)]
    mode: DriverMode
    packages: tuple[Annotated[Str, AfterValidator(check_package)], ...] | None = None

    @model_validator(mode="after")
    def _check_packages(self) -> DriverUpgradeChange:
        if self.mode is DriverMode.OPERATOR and self.packages is not None:
            raise FieldProblem(
                "`packages` applies only to mode: host",
                hint="in operator mode the GPU Operator's driver container is upgraded; remove"
                " `packages`",
            )
        if self.mode is DriverMode.HOST and self.packages == ():
            raise FieldProblem("mode: host needs at least one package in `packages`")
        return self

    @property
    def apt_packages(self) -> tuple[str, ...]:
        """The packages to install in host mode (default nvidia-driver); () in operator mode."""
        if self.mode is DriverMode.OPERATOR:
            return ()
        return self.packages if self.packages is not None else DEFAULT_DRIVER_PACKAGES


# ---------------------------------------------------------------- one entry of `changes:`

Change = RegistryChange | ContainerdChange | TimeSlicingChange | DriverUpgradeChange


class ChangeEntry(SpecModel):
    """One item of `changes:`: a mapping with exactly one key, the change's kind."""

    registry: RegistryChange | None = None
    containerd: ContainerdChange | None = None
    time_slicing: TimeSlicingChange | None = Field(default=None, alias="time-slicing")
    driver_upgrade: DriverUpgradeChange | None = Field(default=None, alias="driver-upgrade")

    @model_validator(mode="before")
    @classmethod
    def _check_one_key(cls, data: Any) -> Any:
        kinds = ", ".join(k.value for k in ChangeKind)
        if isinstance(data, dict) and len(data) != 1:
            found = ", ".join(str(k) for k in data) or "no key"
            raise FieldProblem(
                f"each change has exactly one key ({kinds}), found {found}",
                hint="start each change with its own '- '" if len(data) > 1 else None,
            )
        if isinstance(data, dict):
            (value,) = data.values()
            if value is None:
                raise FieldProblem(f"change {next(iter(data))!r} is empty; expected a mapping")
        return data

    @property
    def change(self) -> Change:
        """The one change this entry holds."""
        for value in (self.registry, self.containerd, self.time_slicing, self.driver_upgrade):
            if value is not None:
                return value
        raise AssertionError("validated entries hold exactly one change")
