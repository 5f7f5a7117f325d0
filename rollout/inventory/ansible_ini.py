"""Ansible INI inventories: hosts, `[group]`, `[group:children]`, `[group:vars]`, inline host
vars, ranges like `gpu[01:04]`."""

from __future__ import annotations

import re
import shlex

from rollout.errors import InputError, SourceLocation
from rollout.inputs.fieldproblems import did_you_mean
from rollout.inventory.ansible import AnsibleInventory
from rollout.inventory.model import UNGROUPED_GROUP, Inventory, InventoryFormat

_SECTION = re.compile(r"^\[([^\]:]+)(?::(\w+))?\]\s*(?:[#;].*)?$")


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def parse_ansible_ini(text: str, source: str) -> Inventory:
    """Hosts of an Ansible INI inventory, variables resolved as Ansible does."""
    inv = AnsibleInventory(source)
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
            _parse_host_line(inv, group, line, where)
    return inv.to_inventory(InventoryFormat.ANSIBLE_INI)


def _parse_host_line(inv: AnsibleInventory, group: str, line: str, where: SourceLocation) -> None:
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
    inv.add_host_pattern(group, pattern, variables, where, pattern)
