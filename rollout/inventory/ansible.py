"""Ansible's inventory model, shared by its INI and YAML formats.

Groups, hosts and variables are collected as Ansible's inventory manager collects them, then
resolved as Ansible resolves them: host vars over child group vars over parent group vars
over `all` vars (groups of equal depth: later name wins). The Kubernetes node name is
`rollout_node_name` when set, else the inventory hostname.
"""

from __future__ import annotations

import re
import string
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rollout.errors import InputError, InputErrors, SourceLocation
from rollout.fieldproblems import FieldProblem, describe_value, sort_errors
from rollout.inventory.model import (
    ALL_GROUP,
    DEFAULT_PORT,
    DEFAULT_USER,
    Host,
    Inventory,
    InventoryFormat,
)
from rollout.spec.fieldtypes import check_dns_subdomain

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


@dataclass
class _Group:
    name: str
    vars: dict[str, str] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)


class AnsibleInventory:
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

    def add_host_pattern(
        self,
        group: str,
        pattern: str,
        variables: Mapping[str, str],
        where: SourceLocation,
        field_name: str,
    ) -> list[str]:
        """Add every host a pattern (`gpu[01:04]:2222`) names; the hosts, [] after an error."""
        name, port = _split_port(pattern)
        if port is not None:
            variables = dict(variables)
            variables.setdefault("ansible_port", port)
        try:
            names = expand_host_pattern(name)
        except FieldProblem as exc:
            self.errors.append(InputError(where, exc.message, field=field_name, hint=exc.hint))
            return []
        for host in names:
            self.add_host(group, host, variables, where)
        return names

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
        """Resolve every host's variables; InputErrors with every problem found."""
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
