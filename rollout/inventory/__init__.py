"""Inventories: which nodes exist and how to reach them over SSH.

Three formats, told apart by content (or named with `format=`), one module each:
- rollout's own YAML (`apiVersion: rollout/v1`, `kind: Inventory`, `defaults`, `nodes`):
  `native`;
- Ansible INI inventories (hosts, `[group]`, `[group:children]`, `[group:vars]`, inline host
  vars, ranges like `gpu[01:04]`): `ansible_ini`;
- Ansible YAML inventories (`all: {hosts: ..., vars: ..., children: ...}`): `ansible_yaml`.

Both Ansible formats collect into `ansible.AnsibleInventory`, which resolves variables as
Ansible does; every format ends in the `model`'s `Inventory` of `Host`s.

Hostile input is refused, located (docs/input-contract.md): files over 1 MiB or not regular,
control characters, YAML over the depth and alias-expansion limits, ranges and inventories of
more than `MAX_HOSTS` hosts, an inventory without hosts, and addresses or users that are not
a host name, an IP address or a user name.
"""

from __future__ import annotations

from pathlib import Path

from rollout.errors import InputError, InputErrors
from rollout.inputs.inputfile import read_text
from rollout.inputs.yamllimits import check_characters
from rollout.inputs.yamlsource import NotYaml, SourceDocument
from rollout.inventory.ansible import expand_host_pattern
from rollout.inventory.ansible_ini import parse_ansible_ini
from rollout.inventory.ansible_yaml import parse_ansible_yaml
from rollout.inventory.model import (
    ALL_GROUP,
    DEFAULT_PORT,
    DEFAULT_USER,
    MAX_HOSTS,
    UNGROUPED_GROUP,
    Host,
    Inventory,
    InventoryFormat,
)
from rollout.inventory.native import parse_rollout_inventory

__all__ = [
    "ALL_GROUP",
    "DEFAULT_PORT",
    "DEFAULT_USER",
    "MAX_HOSTS",
    "UNGROUPED_GROUP",
    "Host",
    "Inventory",
    "InventoryFormat",
    "detect_format",
    "expand_host_pattern",
    "load_inventory",
    "parse_inventory",
]


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
    try:
        check_characters(text, source)
        if format is InventoryFormat.ANSIBLE_INI:
            return parse_ansible_ini(text, source)
        try:
            doc = SourceDocument.from_text(text, source)
        except NotYaml:
            if format is not None:
                raise
            return parse_ansible_ini(text, source)
        chosen = format or _format_of(doc.data)
        if chosen is InventoryFormat.ANSIBLE_INI:
            return parse_ansible_ini(text, source)
        if chosen is InventoryFormat.ROLLOUT:
            return parse_rollout_inventory(doc)
        return parse_ansible_yaml(doc)
    except InputError as exc:
        raise InputErrors([exc]) from exc


def detect_format(text: str, source: str = "<inventory>") -> InventoryFormat:
    """rollout YAML if it says `kind: Inventory`/`apiVersion`, Ansible YAML for other
    mappings, Ansible INI for anything YAML does not read as a mapping.

    YAML is read as every input is (bounded); InputError when it is over a limit.
    """
    try:
        return _format_of(SourceDocument.from_text(text, source).data)
    except NotYaml:
        return InventoryFormat.ANSIBLE_INI


def _format_of(data: object) -> InventoryFormat:
    if not isinstance(data, dict):
        return InventoryFormat.ANSIBLE_INI
    if "apiVersion" in data or data.get("kind") == "Inventory" or "nodes" in data:
        return InventoryFormat.ROLLOUT
    return InventoryFormat.ANSIBLE_YAML
