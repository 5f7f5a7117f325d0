"""rollout's own inventory format: `apiVersion: rollout/v1`, `kind: Inventory`, defaults, nodes."""

from __future__ import annotations

import types
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from rollout.errors import InputError, InputErrors
from rollout.inputs.fieldtypes import Bool, Int, KubeName, SpecModel, Str
from rollout.inputs.yamlsource import SourceDocument
from rollout.inventory.model import (
    DEFAULT_PORT,
    DEFAULT_USER,
    MAX_HOSTS,
    Host,
    Inventory,
    InventoryFormat,
    check_address,
    check_local_path,
    check_user,
    require_mapping,
    var_text,
)

Port = Annotated[Int, Field(ge=1, le=65535)]
Address = Annotated[Str, AfterValidator(check_address)]
User = Annotated[Str, AfterValidator(check_user)]
LocalPath = Annotated[Str, AfterValidator(check_local_path)]
VarValue = Str | Int | Bool


class _Defaults(SpecModel):
    user: User = DEFAULT_USER
    port: Port = DEFAULT_PORT
    key_file: LocalPath | None = None
    become: Bool = False
    known_hosts: LocalPath | None = None


class _Node(SpecModel):
    name: KubeName
    address: Address | None = None
    user: User | None = None
    port: Port | None = None
    key_file: LocalPath | None = None
    become: Bool | None = None
    known_hosts: LocalPath | None = None
    groups: tuple[Str, ...] = ()
    vars: dict[Str, VarValue] = Field(default_factory=dict)


class _RolloutInventory(SpecModel):
    api_version: Literal["rollout/v1"] = Field(alias="apiVersion")
    kind: Literal["Inventory"]
    defaults: _Defaults = _Defaults()
    nodes: Annotated[tuple[_Node, ...], Field(min_length=1, max_length=MAX_HOSTS)]


def parse_rollout_inventory(doc: SourceDocument) -> Inventory:
    """Hosts of a rollout inventory; a node's own settings over `defaults`."""
    require_mapping(doc)
    model = doc.validate(_RolloutInventory)
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
                vars=types.MappingProxyType({k: var_text(v) for k, v in node.vars.items()}),
                known_hosts=node.known_hosts if node.known_hosts is not None else d.known_hosts,
                location=doc.location_of(("nodes", index)),
            )
        )
    if errors:
        raise InputErrors(errors)
    return Inventory(tuple(hosts), doc.path, InventoryFormat.ROLLOUT)
