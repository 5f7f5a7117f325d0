"""Ansible YAML inventories: `all: {hosts: ..., vars: ..., children: ...}`."""

from __future__ import annotations

from typing import Any

from rollout.errors import InputError
from rollout.inputs.fieldproblems import describe_value, did_you_mean
from rollout.inputs.yamlsource import SourceDocument
from rollout.inventory.ansible import AnsibleInventory
from rollout.inventory.model import (
    ALL_GROUP,
    Inventory,
    InventoryFormat,
    require_mapping,
    var_text,
)

_GROUP_KEYS = ("hosts", "vars", "children")


def parse_ansible_yaml(doc: SourceDocument) -> Inventory:
    """Hosts of an Ansible YAML inventory, variables resolved as Ansible does."""
    inv = AnsibleInventory(doc.path)
    for name, body in require_mapping(doc).items():
        _read_group(inv, doc, str(name), body, (name,))
        if str(name) != ALL_GROUP:
            inv.add_child(ALL_GROUP, str(name))
    return inv.to_inventory(InventoryFormat.ANSIBLE_YAML)


def _read_group(
    inv: AnsibleInventory,
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
                    group, str(key), var_text(var), doc.location_of((*path, section, key))
                )
        elif section == "children":
            for child, child_body in value.items():
                inv.add_child(group, str(child))
                _read_group(inv, doc, str(child), child_body, (*path, section, child))
        else:
            for pattern, host_vars in value.items():
                _read_host(inv, doc, group, str(pattern), host_vars, (*path, section, pattern))


def _read_host(
    inv: AnsibleInventory,
    doc: SourceDocument,
    group: str,
    pattern: str,
    host_vars: Any,
    path: tuple[Any, ...],
) -> None:
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
    variables = {str(k): var_text(v) for k, v in (host_vars or {}).items()}
    where = doc.location_of(path, at_key=True)
    for host in inv.add_host_pattern(group, pattern, variables, where, field_name):
        for key in variables:
            inv.var_location[(host, key)] = doc.location_of((*path, key))
