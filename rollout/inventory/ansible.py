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
from rollout.inputs.fieldproblems import FieldProblem, describe_value, sort_errors
from rollout.inputs.fieldtypes import check_dns_subdomain
from rollout.inputs.wholenumber import whole_number
from rollout.inventory.model import (
    ALL_GROUP,
    DEFAULT_PORT,
    DEFAULT_USER,
    MAX_HOSTS,
    Host,
    Inventory,
    InventoryFormat,
    check_address,
    check_local_path,
    check_user,
)

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
    # a dict as an ordered set: membership tests stay O(1) for thousands of hosts
    hosts: dict[str, None] = field(default_factory=dict)


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
        self.over_host_limit = False

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
        self.group(group).hosts.setdefault(host)

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
        if self.over_host_limit:
            return []  # said once, at the first host over the limit
        room = MAX_HOSTS - len(self.host_vars)
        try:
            names = expand_host_pattern(name, limit=max(room, 0))
        except FieldProblem as exc:
            self.over_host_limit = isinstance(exc, TooManyHosts)
            self.errors.append(InputError(where, exc.message, field=field_name, hint=exc.hint))
            return []
        if len(names) > room:
            self.over_host_limit = True
            self.errors.append(
                InputError(
                    where,
                    f"the inventory names more than {MAX_HOSTS} hosts (the limit is {MAX_HOSTS})",
                    field=field_name,
                    hint="split the fleet into several inventories",
                )
            )
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
        """Each group's depth below `all` (its longest parent chain); cycles are errors.

        Kahn's topological order, so a long chain or a dense lattice of groups costs time
        linear in the groups and their children, never recursion or exponential walks.
        """
        parents = self._parent_map()
        for name in self.groups:
            if name != ALL_GROUP and not parents[name]:
                self.groups[ALL_GROUP].children.append(name)
                parents[name].append(ALL_GROUP)
        waiting = {name: len(set(found)) for name, found in parents.items()}
        depths: dict[str, int] = {name: 0 for name, count in waiting.items() if count == 0}
        ready = list(depths)
        while ready:
            name = ready.pop()
            for child in dict.fromkeys(self.groups[name].children):
                depths[child] = max(depths.get(child, 0), depths[name] + 1)
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)
        stuck = [name for name, count in waiting.items() if count > 0]
        if stuck:
            raise InputError(
                SourceLocation(self.source),
                f"group children form a cycle: {self._cycle_through(stuck[0], set(stuck))}",
                hint="a group cannot be its own ancestor",
            )
        return depths

    def _cycle_through(self, start: str, stuck: set[str]) -> str:
        """A cycle among the groups left over by the topological order, as a -> b -> a."""
        parents = self._parent_map()
        chain = [start]
        while True:
            following = next(p for p in parents[chain[-1]] if p in stuck)
            if following in chain:
                cycle = list(reversed([*chain[chain.index(following) :], following]))
                if len(cycle) > 8:  # a hostile chain of thousands: show its ends
                    cycle = [*cycle[:4], f"... ({len(cycle) - 7} more) ...", *cycle[-3:]]
                return " -> ".join(cycle)
            chain.append(following)

    def _parent_map(self) -> dict[str, list[str]]:
        parents: dict[str, list[str]] = {name: [] for name in self.groups}
        for group in self.groups.values():
            for child in group.children:
                parents[child].append(group.name)
        return parents

    def _ancestor_map(self, depths: Mapping[str, int]) -> dict[str, set[str]]:
        """Every group's ancestors, computed once in depth order."""
        parents = self._parent_map()
        ancestors: dict[str, set[str]] = {}
        for name in sorted(self.groups, key=lambda g: depths.get(g, 0)):
            found: set[str] = set()
            for parent in parents[name]:
                found.add(parent)
                found |= ancestors.get(parent, set())
            ancestors[name] = found
        return ancestors

    def to_inventory(self, fmt: InventoryFormat) -> Inventory:
        """Resolve every host's variables; InputErrors with every problem found."""
        depths = self._depths()
        ancestors = self._ancestor_map(depths)
        direct: dict[str, set[str]] = {h: set() for h in self.host_vars}
        for members in self.groups.values():
            for host in members.hosts:
                direct[host].add(members.name)
        hosts: list[Host] = []
        names: dict[str, str] = {}
        for host, own_vars in self.host_vars.items():
            member_of = set(direct[host])
            for group_name in list(member_of):
                member_of |= ancestors[group_name]
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
        if not hosts and not self.errors:
            self.errors.append(
                InputError(
                    SourceLocation(self.source),
                    "the inventory has no hosts",
                    hint="list the GPU nodes, one per line in INI (`gpu1 ansible_host=10.0.0.1`)"
                    " or under `hosts:` in YAML",
                )
            )
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
            number = whole_number(text)
            if number is not None and 1 <= number <= 65535:
                port = number
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
        address = first(ADDRESS_VARS)
        user = first(USER_VARS)
        key_file = first(KEY_FILE_VARS)
        known_hosts = first((KNOWN_HOSTS_VAR,))
        checks = (
            (address or ("host", host), check_address),
            (user, check_user),
            (key_file, check_local_path),
            (known_hosts, check_local_path),
        )
        for named, check in checks:
            if named is None:
                continue
            key, text = named
            try:
                check(text)
            except FieldProblem as exc:
                self.errors.append(
                    InputError(
                        where(key),
                        f"{host}: {key}: {exc.message}",
                        field=key,
                        hint=exc.hint,
                    )
                )
        if len(self.errors) > before:
            return None
        return Host(
            name=name,
            address=address[1] if address else host,
            port=port,
            user=user[1] if user else DEFAULT_USER,
            key_file=key_file[1] if key_file else None,
            become=become,
            groups=frozenset(g for g in member_of if g != ALL_GROUP),
            vars=types.MappingProxyType(dict(merged)),
            known_hosts=known_hosts[1] if known_hosts else None,
            location=self.host_location[host],
        )


_RANGE = re.compile(r"\[([^\]\[]*)\]")


class TooManyHosts(FieldProblem):
    """A host pattern names more hosts than one inventory may hold."""


# digits in a range bound: 10^9 hosts is already far past MAX_HOSTS
_MAX_BOUND_DIGITS = 9


def expand_host_pattern(pattern: str, limit: int = MAX_HOSTS) -> list[str]:
    """Expand Ansible ranges: `gpu[01:03]` -> gpu01 gpu02 gpu03, `n[a:c]`, `[1:9:2]` steps.

    FieldProblem when a range is malformed, or when the pattern names more than `limit`
    hosts (counted before anything is expanded). A bracket without ':' (an IPv6 literal)
    is kept.
    """
    pieces: list[list[str] | str] = []
    total = 1
    rest = pattern
    while True:
        match = next((m for m in _RANGE.finditer(rest) if ":" in m.group(1)), None)
        if match is None:
            pieces.append(rest)
            break
        pieces.append(rest[: match.start()])
        items = _range_items(match.group(1))
        total *= len(items)
        if total > limit:
            named = (
                f"names more than {limit} hosts"
                if limit >= MAX_HOSTS
                else f"takes the inventory over {MAX_HOSTS} hosts"
            )
            raise TooManyHosts(
                f"{pattern!r} {named} (the limit is {MAX_HOSTS} hosts in one inventory)",
                hint="split the fleet into several inventories",
            )
        pieces.append(items)
        rest = rest[match.end() :]
    names = [""]
    for piece in pieces:
        if isinstance(piece, str):
            names = [name + piece for name in names]
        else:
            names = [name + item for name in names for item in piece]
    return names


def _range_items(inside: str) -> list[str]:
    """The items of one range `[start:end(:step)]`, whose count is checked small enough."""
    parts = inside.split(":")
    if len(parts) not in (2, 3):
        raise FieldProblem(f"range [{inside}] must be [start:end] or [start:end:step]")
    begin, end = parts[0], parts[1]
    step_text = parts[2] if len(parts) == 3 else "1"
    if any(len(p) > _MAX_BOUND_DIGITS for p in parts):
        raise FieldProblem(
            f"range [{inside[:40]}] has a bound of more than {_MAX_BOUND_DIGITS} digits",
            hint=f"an inventory names at most {MAX_HOSTS} hosts",
        )
    step = whole_number(step_text) or 0
    if step < 1:
        raise FieldProblem(f"range step {step_text!r} must be a positive integer")
    if not end:
        raise FieldProblem(f"range [{inside}] has no end")
    if whole_number(end) is not None and (whole_number(begin) is not None or not begin):
        begin = begin or "0"
        if int(begin) > int(end):
            raise FieldProblem(f"range [{inside}] runs backwards")
        numbers = range(int(begin), int(end) + 1, step)
        if len(numbers) > MAX_HOSTS:
            raise TooManyHosts(
                f"range [{inside}] names {len(numbers)} hosts (the limit is {MAX_HOSTS} hosts"
                " in one inventory)",
                hint="split the fleet into several inventories",
            )
        # zero-padded when the start is written with leading zeros, as Ansible does
        width = len(begin) if begin.startswith("0") and len(begin) > 1 else 0
        return [str(i).zfill(width) for i in numbers]
    if len(begin) == 1 and len(end) == 1 and begin.isalpha() and end.isalpha():
        letters = string.ascii_letters
        if begin not in letters or end not in letters:
            raise FieldProblem(f"range [{inside}] must use ASCII letters ([a:f])")
        first, last = letters.index(begin), letters.index(end)
        if first > last:
            raise FieldProblem(f"range [{inside}] runs backwards")
        return list(letters[first : last + 1 : step])
    raise FieldProblem(f"range [{inside}] must be numeric ([01:10]) or single letters ([a:f])")


def _split_port(pattern: str) -> tuple[str, str | None]:
    """`host:2222` or `gpu[01:04]:2222` -> (host, "2222"); IPv6 literals and range colons
    are left alone: the port is a trailing `:N` whose host has colons only inside ranges."""
    if pattern.startswith("[") and "]:" in pattern:
        host, port = pattern[1:].split("]:", 1)  # [2001:db8::1]:2222
        if whole_number(port) is not None and host.count(":") >= 2:
            return host, port
    host, colon, port = pattern.rpartition(":")
    outside_ranges = re.sub(r"\[[^\]]*\]", "", host)
    if colon and host and whole_number(port) is not None and ":" not in outside_ranges:
        return host, port
    return pattern, None
