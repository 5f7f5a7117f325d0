"""The inventory model every format reads into: hosts, their groups and how to reach them."""

from __future__ import annotations

import ipaddress
import json
import re
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from rollout.errors import InputError, InputErrors, SourceLocation
from rollout.inputs.fieldproblems import FieldProblem, describe_value, did_you_mean
from rollout.inputs.yamlsource import SourceDocument

DEFAULT_USER = "root"
DEFAULT_PORT = 22
ALL_GROUP = "all"
UNGROUPED_GROUP = "ungrouped"
# The most hosts one inventory may name, ranges expanded (a range is refused before it is
# expanded): far above the GPU nodes of any one cluster, small enough to plan in seconds.
MAX_HOSTS = 10_000

# An SSH destination: DNS labels (underscores allowed, as in /etc/hosts and ssh_config), never
# starting with '-' (ssh would read it as an option).
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_]([-A-Za-z0-9_]{0,61}[A-Za-z0-9_])?"
    r"(\.[A-Za-z0-9_]([-A-Za-z0-9_]{0,61}[A-Za-z0-9_])?)*\.?$"
)
_DOTTED_NUMBERS = re.compile(r"^[0-9.]+$")
_USER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")


def check_address(value: str) -> str:
    """A host name or an IP address to reach over SSH; FieldProblem for anything else."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if _HOST_NAME.match(value) and not _DOTTED_NUMBERS.match(value):
        return value
    hint = "letters, digits, '-', '_' and '.' or an IP address; no spaces, ';' or quotes"
    if value.startswith("[") and value.endswith("]"):
        hint = f"write the IPv6 address without brackets: {value[1:-1]}"
    elif _DOTTED_NUMBERS.match(value):
        hint = "each part of an IPv4 address is 0 to 255, and there are four"
    raise FieldProblem(
        f"expected a host name or an IP address, found {describe_value(value)}", hint=hint
    )


def check_user(value: str) -> str:
    """A POSIX user name for SSH; FieldProblem for anything else."""
    if _USER_NAME.match(value):
        return value
    raise FieldProblem(
        "expected a user name (a letter or '_', then letters, digits, '_', '.' or '-';"
        f" at most 32), found {describe_value(value)}"
    )


def check_local_path(value: str) -> str:
    """A path on this machine (a key file, known_hosts): non-empty, no control characters."""
    if value and not any(ord(c) < 32 or ord(c) == 127 for c in value):
        return value
    raise FieldProblem(
        f"expected a file path without control characters, found {describe_value(value)}"
    )


class InventoryFormat(Enum):
    """The inventory file formats rollout reads."""

    ROLLOUT = "rollout"
    ANSIBLE_INI = "ansible-ini"
    ANSIBLE_YAML = "ansible-yaml"


@dataclass(frozen=True)
class Host:
    """One node: its Kubernetes name and how to reach it over SSH."""

    name: str
    address: str
    port: int = DEFAULT_PORT
    user: str = DEFAULT_USER
    key_file: str | None = None
    become: bool = False
    groups: frozenset[str] = frozenset()
    vars: Mapping[str, str] = field(default_factory=lambda: types.MappingProxyType({}), hash=False)
    known_hosts: str | None = None
    location: SourceLocation | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Inventory:
    """The hosts of one inventory file, in file order."""

    hosts: tuple[Host, ...]
    source: str
    format: InventoryFormat = InventoryFormat.ROLLOUT

    def by_name(self, name: str) -> Host | None:
        """The host whose Kubernetes node name is `name`, or None."""
        return next((h for h in self.hosts if h.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    @property
    def groups(self) -> frozenset[str]:
        """Every group some host belongs to."""
        return frozenset(g for h in self.hosts for g in h.groups)

    def select(self, groups: Sequence[str] | None) -> Inventory:
        """The hosts in any of `groups` (None or "all": every host); InputError for unknowns."""
        if groups is None or ALL_GROUP in groups:
            return self
        unknown = [g for g in groups if g not in self.groups]
        if unknown:
            raise InputError(
                SourceLocation(self.source),
                f"no group {unknown[0]!r} in the inventory",
                field="groups",
                hint=did_you_mean(unknown[0], self.groups)
                or "groups: " + (", ".join(sorted(self.groups)) or "(none)"),
            )
        wanted = frozenset(groups)
        return replace(self, hosts=tuple(h for h in self.hosts if h.groups & wanted))


def var_text(value: object) -> str:
    """An inventory variable as text; booleans the way YAML writes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, default=str)


def require_mapping(doc: SourceDocument) -> dict[object, object]:
    """The document's top level; InputErrors when it is not a mapping."""
    if isinstance(doc.data, dict):
        return doc.data
    raise InputErrors(
        [
            InputError(
                doc.location_of(()),
                f"expected a mapping at the top level, found {describe_value(doc.data)}",
            )
        ]
    )
