"""Recorded facts: a directory of node facts, read by `rollout plan --facts DIR`.

Recorded and live facts (rollout.facts.live) have one shape, so the planner never knows
which it plans from. The recorded texts go through the same parsers as the live commands'
output (`containerd_version` is the output of `containerd --version`).

Layout, one directory per node:

    <dir>/<node>/node.yaml           name, containerd --version output, labels, GPUs, ...
    <dir>/<node>/files/etc/containerd/config.toml
    <dir>/<node>/files/etc/containerd/conf.d/99-nvidia.toml
    <dir>/<node>/files/...           every other file containerd imports, and certs.d
    <dir>/cluster.yaml               optional: ConfigMaps and the ClusterPolicy
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rollout.containerd import ConfigFiles
from rollout.errors import InputError, RolloutError, SourceLocation
from rollout.facts.containerd import DEFAULT_CONTAINERD_CONFIG, ContainerdVersionFact
from rollout.facts.gpu import GpuFacts
from rollout.facts.model import ClusterFacts, FleetFacts, NodeFacts

NODE_FILE = "node.yaml"
CLUSTER_FILE = "cluster.yaml"
NODE_KEYS = frozenset(
    {
        "name",
        "containerd_version",
        "containerd_config",
        "labels",
        "annotations",
        "unschedulable",
        "ready",
        "gpus",
    }
)


def load_recorded_facts(directory: Path) -> FleetFacts:
    """Read a recorded-facts directory (see the module docstring for its layout)."""
    if not directory.is_dir():
        raise InputError(
            SourceLocation(str(directory)),
            "facts directory not found",
            hint="pass --facts DIR with one sub-directory per node holding node.yaml and files/",
        )
    node_dirs = sorted(p for p in directory.iterdir() if (p / NODE_FILE).is_file())
    if not node_dirs:
        raise InputError(
            SourceLocation(str(directory)),
            f"no node facts: no sub-directory holds a {NODE_FILE}",
            hint="each node's facts live in <dir>/<node>/node.yaml and <dir>/<node>/files/",
        )
    return FleetFacts(
        nodes=tuple(load_node_facts(d) for d in node_dirs),
        cluster=load_cluster_facts(directory / CLUSTER_FILE),
        source=str(directory),
    )


def load_node_facts(node_dir: Path) -> NodeFacts:
    """Read one node's recorded facts."""
    path = node_dir / NODE_FILE
    raw = _read_yaml_mapping(path)
    location = SourceLocation(str(path))
    unknown = sorted(set(raw) - NODE_KEYS)
    if unknown:
        raise InputError(
            location,
            f"unknown key {unknown[0]!r}",
            hint="known keys: " + ", ".join(sorted(NODE_KEYS)),
        )
    name = str(raw.get("name") or node_dir.name)
    version_text = raw.get("containerd_version")
    if not isinstance(version_text, str):
        raise InputError(
            location,
            "missing: the output of `containerd --version`",
            field="containerd_version",
        )
    try:
        containerd = ContainerdVersionFact().parse(version_text, name)
    except RolloutError as exc:
        raise InputError(location, str(exc), field="containerd_version") from exc
    main_path = str(raw.get("containerd_config") or DEFAULT_CONTAINERD_CONFIG)
    files_root = node_dir / "files"
    if not (files_root / main_path.lstrip("/")).is_file():
        raise InputError(
            location,
            f"{main_path} is not among the recorded files",
            field="containerd_config",
            hint=f"record the node's files under {files_root}{main_path}",
        )
    config_files = ConfigFiles.from_directory(files_root, main_path, under="/")
    return NodeFacts(
        name=name,
        containerd=containerd,
        config_files=config_files,
        labels=_string_map(raw.get("labels"), location, "labels"),
        annotations=_string_map(raw.get("annotations"), location, "annotations"),
        unschedulable=bool(raw.get("unschedulable", False)),
        ready=bool(raw.get("ready", True)),
        gpus=_parse_gpus(raw.get("gpus"), location),
    )


def load_cluster_facts(path: Path) -> ClusterFacts:
    if not path.is_file():
        return ClusterFacts()
    raw = _read_yaml_mapping(path)
    location = SourceLocation(str(path))
    configmaps: dict[str, dict[str, str]] = {}
    for key, data in (raw.get("configmaps") or {}).items():
        if "/" not in str(key):
            raise InputError(
                location, f"{key!r}: name ConfigMaps as namespace/name", field="configmaps"
            )
        configmaps[str(key)] = _string_map(data, location, f"configmaps.{key}")
    policy = raw.get("cluster_policy") or {}
    if not isinstance(policy, Mapping):
        raise InputError(
            location, "expected a mapping (the ClusterPolicy spec)", field="cluster_policy"
        )
    return ClusterFacts(configmaps=configmaps, cluster_policy=dict(policy))


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    location = SourceLocation(str(path))
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError(location, f"cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            location = SourceLocation(str(path), mark.line + 1, mark.column + 1)
        raise InputError(location, f"not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InputError(location, "expected a mapping at the top level")
    return raw


def _string_map(value: Any, location: SourceLocation, field_name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(location, "expected a mapping of strings", field=field_name)
    return {str(k): "" if v is None else str(v) for k, v in value.items()}


def _parse_gpus(value: Any, location: SourceLocation) -> GpuFacts:
    if value is None:
        return GpuFacts(count=0)
    if not isinstance(value, Mapping):
        raise InputError(location, "expected {count, product, uuids}", field="gpus")
    uuids = tuple(str(u) for u in value.get("uuids") or ())
    count = int(value.get("count", len(uuids)))
    return GpuFacts(
        count=count,
        product=str(value.get("product", "")),
        uuids=uuids,
        driver_version=str(value.get("driver_version", "")),
    )
