"""Inventories: which nodes exist and how to reach them over SSH.

Three formats, told apart by content (or named with `format=`):
- rollout's own YAML (`apiVersion: rollout/v1`, `kind: Inventory`, `defaults`, `nodes`);
- Ansible INI inventories (hosts, `[group]`, `[group:children]`, `[group:vars]`, inline host
  vars, ranges like `gpu[01:04]`);
- Ansible YAML inventories (`all: {hosts: ..., vars: ..., children: ...}`).

Ansible variables resolve as Ansible resolves them: host vars over child group vars over
parent group vars over `all` vars (groups of equal depth: later name wins). The Kubernetes
node name is `rollout_node_name` when set, else the inventory hostname.
"""

from __future__ import annotations

import json
import re
import shlex
import string
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import Field

from rollout.errors import InputError, InputErrors, SourceLocation
from rollout.spec.fieldtypes import Bool, Int, KubeName, SpecModel, Str, check_dns_subdomain
from rollout.yamlsource import (
    FieldProblem,
    SourceDocument,
    describe_value,
    did_you_mean,
    read_text,
    sort_errors,
)

DEFAULT_USER = "root"
DEFAULT_PORT = 22
ALL_GROUP = "all"
UNGROUPED_GROUP = "ungrouped"

# Ansible's connection variables and their older spellings, first match wins.
ADDRESS_VARS = ("ansible_host", "ansible_ssh_host")
PORT_VARS = ("ansible_port", "ansible_ssh_port")
USER_VARS = ("ansible_user", "ansible_ssh_user")
KEY_FILE_VARS = ("ansible_ssh_private_key_file", "ansible_private_key_file")
BECOME_VARS = ("ansible_become",)
NODE_NAME_VAR = "rollout_node_name"
KNOWN_HOSTS_VAR = "rollout_known_hosts"

_TRUE = frozenset({"true", "yes", "on", "1", "y", "t"})
_FALSE = frozenset({"false", "no", "off", "0", "n", "f"})


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


def load_inventory(path: Path, format: InventoryFormat | None = None) -> Inventory:
    """Read an inventory file, detecting its format unless `format` names it.

    Raises InputErrors (exit 2) listing every problem found.
    """
    try:
        text = read_text(path)
    except InputError as exc:
        raise InputErrors([exc]) from exc
    return parse_inventory(text, str(path), format)


def parse_inventory(text: str, source: str, format: InventoryFormat | None = None) -> Inventory:
    """Parse inventory text; `source` names it in messages."""
    chosen = format or detect_format(text)
    try:
        if chosen is InventoryFormat.ANSIBLE_INI:
            return _parse_ini(text, source)
        doc = SourceDocument.from_text(text, source)
        if chosen is InventoryFormat.ROLLOUT:
            return _parse_rollout(doc)
        return _parse_ansible_yaml(doc)
    except InputError as exc:
        raise InputErrors([exc]) from exc


def detect_format(text: str) -> InventoryFormat:
    """rollout YAML if it says `kind: Inventory`/`apiVersion`, Ansible YAML for other
    mappings, Ansible INI for anything YAML does not read as a mapping."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return InventoryFormat.ANSIBLE_INI
    if not isinstance(data, dict):
        return InventoryFormat.ANSIBLE_INI
    if "apiVersion" in data or data.get("kind") == "Inventory" or "nodes" in data:
        return InventoryFormat.ROLLOUT
    return InventoryFormat.ANSIBLE_YAML


# ---------------------------------------------------------------- rollout's own format


Port = Annotated[Int, Field(ge=1, le=65535)]
VarValue = Str | Int | Bool


class _Defaults(SpecModel):
    user: Str = DEFAULT_USER
    port: Port = DEFAULT_PORT
    key_file: Str | None = None
    become: Bool = False
    known_hosts: Str | None = None


class _Node(SpecModel):
    name: KubeName
    address: Str | None = None
    user: Str | None = None
    port: Port | None = None
    key_file: Str | None = None
    become: Bool | None = None
    known_hosts: Str | None = None
    groups: tuple[Str, ...] = ()
    vars: dict[Str, VarValue] = Field(default_factory=dict)


class _RolloutInventory(SpecModel):
    api_version: Literal["rollout/v1"] = Field(alias="apiVersion")
    kind: Literal["Inventory"]
    defaults: _Defaults = _Defaults()
    nodes: Annotated[tuple[_Node, ...], Field(min_length=1)]


def _parse_rollout(doc: SourceDocument) -> Inventory:
    if not isinstance(doc.data, dict):
        raise _not_a_mapping(doc)
    try:
        model = _RolloutInventory.model_validate(doc.data)
    except pydantic.ValidationError as exc:
        raise InputErrors(doc.errors_from(exc, _RolloutInventory)) from exc
    d = model.defaults
    hosts: list[Host] = []
    errors: list[InputError] = []
    first_line: dict[str, int] = {}
    for index, node in enumerate(model.nodes):
        where = doc.location_of(("nodes", index, "name"))
        if node.name in first_line:
            errors.append(
                InputError(
                    where,
                    f"node {node.name!r} is listed twice (first at line {first_line[node.name]})",
                    field=f"nodes[{index}].name",
                )
            )
            continue
        first_line[node.name] = where.line or 0
        hosts.append(
            Host(
                name=node.name,
                address=node.address or node.name,
                port=node.port if node.port is not None else d.port,
                user=node.user if node.user is not None else d.user,
                key_file=node.key_file if node.key_file is not None else d.key_file,
                become=node.become if node.become is not None else d.become,
                groups=frozenset(node.groups),
                vars=types.MappingProxyType({k: _var_text(v) for k, v in node.vars.items()}),
                known_hosts=node.known_hosts if node.known_hosts is not None else d.known_hosts,
                location=doc.location_of(("nodes", index)),
            )
        )
    if errors:
        raise InputErrors(errors)
    return Inventory(tuple(hosts), doc.path, InventoryFormat.ROLLOUT)


def _not_a_mapping(doc: SourceDocument) -> InputErrors:
    return InputErrors(
        [
            InputError(
                doc.location_of(()),
                f"expected a mapping at the top level, found {describe_value(doc.data)}",
            )
        ]
    )


def _var_text(value: object) -> str:
    """An inventory variable as text; booleans the way YAML writes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, default=str)


# ---------------------------------------------------------------- Ansible's model


@dataclass
class _Group:
    name: str
    vars: dict[str, str] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)


class _AnsibleInventory:
    """Groups, hosts and variables as Ansible's inventory manager collects them."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.groups: dict[str, _Group] = {ALL_GROUP: _Group(ALL_GROUP)}
        self.host_vars: dict[str, dict[str, str]] = {}
        self.host_location: dict[str, SourceLocation] = {}
        # where each variable was set, keyed by (host or group name, variable)
        self.var_location: dict[tuple[str, str], SourceLocation] = {}
        self.errors: list[InputError] = []

    def group(self, name: str) -> _Group:
        return self.groups.setdefault(name, _Group(name))

    def add_host(
        self, group: str, host: str, variables: Mapping[str, str], where: SourceLocation
    ) -> None:
        self.host_location.setdefault(host, where)
        merged = self.host_vars.setdefault(host, {})
        for key, value in variables.items():
            merged[key] = value
            self.var_location[(host, key)] = where
        members = self.group(group).hosts
        if host not in members:
            members.append(host)

    def add_child(self, parent: str, child: str) -> None:
        children = self.group(parent).children
        self.group(child)
        if child not in children:
            children.append(child)

    def set_group_var(self, group: str, key: str, value: str, where: SourceLocation) -> None:
        self.group(group).vars[key] = value
        self.var_location[(group, key)] = where

    def _depths(self) -> dict[str, int]:
        """Each group's depth below `all` (its longest parent chain); cycles are errors."""
        for name in list(self.groups):
            if name != ALL_GROUP and not self._parents(name):
                self.groups[ALL_GROUP].children.append(name)
        depths: dict[str, int] = {}

        def visit(name: str, depth: int, chain: tuple[str, ...]) -> None:
            if name in chain:
                cycle = " -> ".join((*chain[chain.index(name) :], name))
                raise InputError(
                    SourceLocation(self.source),
                    f"group children form a cycle: {cycle}",
                    hint="a group cannot be its own ancestor",
                )
            if depths.get(name, -1) >= depth:
                return
            depths[name] = depth
            for child in self.groups[name].children:
                visit(child, depth + 1, (*chain, name))

        visit(ALL_GROUP, 0, ())
        # groups that are only each other's children are unreachable from `all`: a cycle
        for name in self.groups:
            if name not in depths:
                visit(name, 1, ())
        return depths

    def _parents(self, name: str) -> list[str]:
        return [g.name for g in self.groups.values() if name in g.children]

    def _ancestors(self, name: str) -> set[str]:
        found: set[str] = set()
        todo = [name]
        while todo:
            for parent in self._parents(todo.pop()):
                if parent not in found:
                    found.add(parent)
                    todo.append(parent)
        return found

    def to_inventory(self, fmt: InventoryFormat) -> Inventory:
        depths = self._depths()
        direct: dict[str, set[str]] = {h: set() for h in self.host_vars}
        for members in self.groups.values():
            for host in members.hosts:
                direct[host].add(members.name)
        hosts: list[Host] = []
        names: dict[str, str] = {}
        for host, own_vars in self.host_vars.items():
            member_of = set(direct[host])
            for group_name in list(member_of):
                member_of |= self._ancestors(group_name)
            member_of.add(ALL_GROUP)
            # Ansible's order: shallow groups first, equal depth by name; host vars last
            merged: dict[str, str] = {}
            origin: dict[str, str] = {}
            for group_name in sorted(member_of, key=lambda g: (depths.get(g, 0), g)):
                for key, value in self.groups[group_name].vars.items():
                    merged[key] = value
                    origin[key] = group_name
            for key, value in own_vars.items():
                merged[key] = value
                origin[key] = host
            resolved = self._host_from_vars(host, merged, origin, member_of)
            if resolved is None:
                continue
            if resolved.name in names:
                self.errors.append(
                    InputError(
                        self.host_location[host],
                        f"hosts {names[resolved.name]!r} and {host!r} both map to node"
                        f" {resolved.name!r}",
                        field=NODE_NAME_VAR,
                        hint="each inventory host must be a different Kubernetes node",
                    )
                )
                continue
            names[resolved.name] = host
            hosts.append(resolved)
        if self.errors:
            raise InputErrors(sort_errors(self.errors))
        return Inventory(tuple(hosts), self.source, fmt)

    def _host_from_vars(
        self,
        host: str,
        merged: Mapping[str, str],
        origin: Mapping[str, str],
        member_of: Iterable[str],
    ) -> Host | None:
        before = len(self.errors)

        def where(key: str) -> SourceLocation:
            found = self.var_location.get((origin.get(key, host), key))
            return found or self.host_location[host]

        def first(keys: Sequence[str]) -> tuple[str, str] | None:
            return next(((k, merged[k]) for k in keys if k in merged), None)

        name = merged.get(NODE_NAME_VAR, host)
        try:
            check_dns_subdomain(name)
        except FieldProblem as exc:
            key = NODE_NAME_VAR if NODE_NAME_VAR in merged else "host"
            self.errors.append(
                InputError(
                    where(key),
                    f"{host}: node name: {exc.message}",
                    field=key,
                    hint=f"set {NODE_NAME_VAR}=<the Kubernetes node name> on the host",
                )
            )
        port = DEFAULT_PORT
        port_var = first(PORT_VARS)
        if port_var is not None:
            key, text = port_var
            if text.isdigit() and 1 <= int(text) <= 65535:
                port = int(text)
            else:
                self.errors.append(
                    InputError(
                        where(key),
                        f"{host}: expected a port from 1 to 65535, found {describe_value(text)}",
                        field=key,
                    )
                )
        become = False
        become_var = first(BECOME_VARS)
        if become_var is not None:
            key, text = become_var
            if text.lower() in _TRUE | _FALSE:
                become = text.lower() in _TRUE
            else:
                self.errors.append(
                    InputError(
                        where(key),
                        f"{host}: expected a boolean, found {describe_value(text)}",
                        field=key,
                        hint="use true or false",
                    )
                )
        if len(self.errors) > before:
            return None
        address = first(ADDRESS_VARS)
        user = first(USER_VARS)
        key_file = first(KEY_FILE_VARS)
        return Host(
            name=name,
            address=address[1] if address else host,
            port=port,
            user=user[1] if user else DEFAULT_USER,
            key_file=key_file[1] if key_file else None,
            become=become,
            groups=frozenset(g for g in member_of if g != ALL_GROUP),
            vars=types.MappingProxyType(dict(merged)),
            known_hosts=merged.get(KNOWN_HOSTS_VAR),
            location=self.host_location[host],
        )


# ---------------------------------------------------------------- host patterns and ranges

_RANGE = re.compile(r"\[([^\]\[]*)\]")


def expand_host_pattern(pattern: str) -> list[str]:
    """Expand Ansible ranges: `gpu[01:03]` -> gpu01 gpu02 gpu03, `n[a:c]`, `[1:9:2]` steps.

    FieldProblem when a range is malformed. A bracket without ':' (an IPv6 literal) is kept.
    """
    match = next((m for m in _RANGE.finditer(pattern) if ":" in m.group(1)), None)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    parts = match.group(1).split(":")
    if len(parts) not in (2, 3):
        raise FieldProblem(f"range [{match.group(1)}] must be [start:end] or [start:end:step]")
    begin, end = parts[0], parts[1]
    step_text = parts[2] if len(parts) == 3 else "1"
    if not step_text.isdigit() or int(step_text) < 1:
        raise FieldProblem(f"range step {step_text!r} must be a positive integer")
    step = int(step_text)
    if not end:
        raise FieldProblem(f"range [{match.group(1)}] has no end")
    items: list[str]
    if end.isdigit() and (begin.isdigit() or not begin):
        begin = begin or "0"
        if int(begin) > int(end):
            raise FieldProblem(f"range [{match.group(1)}] runs backwards")
        # zero-padded when the start is written with leading zeros, as Ansible does
        width = len(begin) if begin.startswith("0") and len(begin) > 1 else 0
        items = [str(i).zfill(width) for i in range(int(begin), int(end) + 1, step)]
    elif len(begin) == 1 and len(end) == 1 and begin.isalpha() and end.isalpha():
        letters = string.ascii_letters
        first, last = letters.index(begin), letters.index(end)
        if first > last:
            raise FieldProblem(f"range [{match.group(1)}] runs backwards")
        items = list(letters[first : last + 1 : step])
    else:
        raise FieldProblem(
            f"range [{match.group(1)}] must be numeric ([01:10]) or single letters ([a:f])"
        )
    return [head + item + rest for item in items for rest in expand_host_pattern(tail)]


def _split_port(pattern: str) -> tuple[str, str | None]:
    """`host:2222` -> (host, "2222"); IPv6 literals and range colons are left alone."""
    if pattern.count(":") == 1 and "[" not in pattern:
        host, port = pattern.split(":")
        if port.isdigit():
            return host, port
    if pattern.startswith("[") and "]:" in pattern:
        host, port = pattern[1:].split("]:", 1)
        if port.isdigit():
            return host, port
    return pattern, None


# ---------------------------------------------------------------- Ansible INI

_SECTION = re.compile(r"^\[([^\]:]+)(?::(\w+))?\]\s*(?:[#;].*)?$")


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _parse_ini(text: str, source: str) -> Inventory:
    inv = _AnsibleInventory(source)
    group, kind = UNGROUPED_GROUP, "hosts"
    for number, raw in enumerate(text.splitlines(), start=1):
        where = SourceLocation(source, number)
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = _SECTION.match(line)
            if section is None or (section.group(2) or "hosts") not in (
                "hosts",
                "vars",
                "children",
            ):
                suffix = section.group(2) if section else None
                inv.errors.append(
                    InputError(
                        where,
                        f"bad section header {line!r}",
                        hint=did_you_mean(suffix, ("vars", "children"))
                        if suffix
                        else "use [group], [group:vars] or [group:children]",
                    )
                )
                group, kind = "", "skip"
                continue
            group, kind = section.group(1).strip(), section.group(2) or "hosts"
            inv.group(group)
            continue
        if kind == "skip":
            continue
        if kind == "vars":
            key, eq, value = line.partition("=")
            if not eq or not key.strip():
                inv.errors.append(
                    InputError(
                        where,
                        f"expected key=value in [{group}:vars], found {line!r}",
                        field=f"{group}:vars",
                    )
                )
                continue
            inv.set_group_var(group, key.strip(), _unquote(value.strip()), where)
        elif kind == "children":
            inv.add_child(group, line.split()[0])
        else:
            _parse_ini_host(inv, group, line, where)
    return inv.to_inventory(InventoryFormat.ANSIBLE_INI)


def _parse_ini_host(inv: _AnsibleInventory, group: str, line: str, where: SourceLocation) -> None:
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as exc:
        inv.errors.append(InputError(where, f"cannot split host line: {exc}", field=group))
        return
    if not tokens:
        return
    pattern, *assignments = tokens
    variables: dict[str, str] = {}
    for item in assignments:
        key, eq, value = item.partition("=")
        if not eq or not key:
            inv.errors.append(
                InputError(
                    where,
                    f"expected key=value after the host name, found {item!r}",
                    field=pattern,
                    hint="quote values with spaces: key='a b'",
                )
            )
            return
        variables[key] = value
    name, port = _split_port(pattern)
    if port is not None:
        variables.setdefault("ansible_port", port)
    try:
        names = expand_host_pattern(name)
    except FieldProblem as exc:
        inv.errors.append(InputError(where, exc.message, field=pattern, hint=exc.hint))
        return
    for host in names:
        inv.add_host(group, host, variables, where)


# ---------------------------------------------------------------- Ansible YAML

_GROUP_KEYS = ("hosts", "vars", "children")


def _parse_ansible_yaml(doc: SourceDocument) -> Inventory:
    if not isinstance(doc.data, dict):
        raise _not_a_mapping(doc)
    inv = _AnsibleInventory(doc.path)
    for name, body in doc.data.items():
        _read_yaml_group(inv, doc, str(name), body, (name,))
        if str(name) != ALL_GROUP:
            inv.add_child(ALL_GROUP, str(name))
    return inv.to_inventory(InventoryFormat.ANSIBLE_YAML)


def _read_yaml_group(
    inv: _AnsibleInventory,
    doc: SourceDocument,
    group: str,
    body: Any,
    path: tuple[Any, ...],
) -> None:
    inv.group(group)
    if body is None:
        return
    field_name = ".".join(str(p) for p in path)
    if not isinstance(body, dict):
        inv.errors.append(
            InputError(
                doc.location_of(path),
                f"expected a group (hosts, vars, children), found {describe_value(body)}",
                field=field_name,
            )
        )
        return
    for key in body:
        if key not in _GROUP_KEYS:
            inv.errors.append(
                InputError(
                    doc.location_of((*path, key), at_key=True),
                    f"unknown key {key!r} in group {group!r}",
                    field=field_name,
                    hint=did_you_mean(str(key), _GROUP_KEYS) or "a group has hosts, vars, children",
                )
            )
    for section in _GROUP_KEYS:
        value = body.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            inv.errors.append(
                InputError(
                    doc.location_of((*path, section)),
                    f"expected a mapping, found {describe_value(value)}",
                    field=f"{field_name}.{section}",
                    hint="hosts are a mapping: `host1:` on its own line, vars below it"
                    if section == "hosts"
                    else None,
                )
            )
            continue
        if section == "vars":
            for key, var in value.items():
                inv.set_group_var(
                    group, str(key), _var_text(var), doc.location_of((*path, section, key))
                )
        elif section == "children":
            for child, child_body in value.items():
                inv.add_child(group, str(child))
                _read_yaml_group(inv, doc, str(child), child_body, (*path, section, child))
        else:
            for pattern, host_vars in value.items():
                _read_yaml_host(inv, doc, group, str(pattern), host_vars, (*path, section, pattern))


def _read_yaml_host(
    inv: _AnsibleInventory,
    doc: SourceDocument,
    group: str,
    pattern: str,
    host_vars: Any,
    path: tuple[Any, ...],
) -> None:
    where = doc.location_of(path, at_key=True)
    field_name = ".".join(str(p) for p in path)
    if host_vars is not None and not isinstance(host_vars, dict):
        inv.errors.append(
            InputError(
                doc.location_of(path),
                f"expected the host's variables as a mapping, found {describe_value(host_vars)}",
                field=field_name,
            )
        )
        return
    name, port = _split_port(pattern)
    variables = {str(k): _var_text(v) for k, v in (host_vars or {}).items()}
    if port is not None:
        variables.setdefault("ansible_port", port)
    try:
        names = expand_host_pattern(name)
    except FieldProblem as exc:
        inv.errors.append(InputError(where, exc.message, field=field_name, hint=exc.hint))
        return
    for host in names:
        inv.add_host(group, host, variables, where)
        for key in variables:
            inv.var_location[(host, key)] = doc.location_of((*path, key))
