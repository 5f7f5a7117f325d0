"""cluster.yaml of a recorded-facts directory: ConfigMaps, the ClusterPolicy, and what diagnose
reads of the cluster (RuntimeClasses, pods with their events, the GPU Operator's DaemonSets,
controllers' refusals). Every field is optional, so facts recorded for `plan` alone still load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from rollout.errors import InputError, InputErrors
from rollout.facts.daemonsets import DaemonSetFacts
from rollout.facts.model import ClusterFacts
from rollout.facts.pods import parse_pod_manifest
from rollout.inputs.fieldproblems import FieldProblem, describe_value
from rollout.inputs.fieldtypes import SpecModel, Str, check_dns_subdomain
from rollout.inputs.yamlsource import SourceDocument


class ClusterRecord(SpecModel):
    """cluster.yaml: ConfigMaps by namespace/name, and the ClusterPolicy spec."""

    configmaps: Mapping[Str, Mapping[Str, Str | None]] = Field(default_factory=dict)
    cluster_policy: Mapping[Str, Any] | None = None
    # NVIDIADriver resources by name, each its spec
    nvidia_drivers: Mapping[Str, Mapping[Str, Any]] = Field(default_factory=dict)
    # for diagnose: RuntimeClass name -> handler, pods as the API returns them, their events
    runtime_classes: Mapping[Str, Str] | None = None
    pods: tuple[Mapping[Str, Any], ...] = ()
    pod_events: Mapping[Str, tuple[Str, ...]] = Field(default_factory=dict)
    # the GPU Operator's DaemonSets as manifests (rollout.facts.daemonsets); absent: not known
    daemonsets: tuple[Mapping[Str, Any], ...] | None = None
    failed_creates: Mapping[Str, tuple[Str, ...]] = Field(default_factory=dict)


def load_cluster_facts(path: Path) -> ClusterFacts:
    """Read cluster.yaml (absent: no ConfigMaps, no ClusterPolicy)."""
    if not os.path.lexists(path):
        return ClusterFacts()
    doc = SourceDocument.from_path(path)
    if not isinstance(doc.data, dict):
        raise InputError(
            doc.location_of(()),
            f"expected a mapping (configmaps, cluster_policy), found {describe_value(doc.data)}",
        )
    record = doc.validate(ClusterRecord)
    errors = [
        InputError(
            doc.location_of(("configmaps", key), at_key=True),
            f"expected a ConfigMap named namespace/name, found {describe_value(key)}",
            field="configmaps",
        )
        for key in record.configmaps
        if not _is_configmap_name(key)
    ]
    if errors:
        raise InputErrors(errors)
    return ClusterFacts(
        configmaps={k: strings(v) for k, v in record.configmaps.items()},
        cluster_policy=dict(record.cluster_policy or {}),
        nvidia_drivers={k: dict(v) for k, v in record.nvidia_drivers.items()},
        runtime_classes=None if record.runtime_classes is None else dict(record.runtime_classes),
        pods=tuple(parse_pod_manifest(p) for p in record.pods),
        pod_events=dict(record.pod_events),
        daemonsets=None
        if record.daemonsets is None
        else tuple(DaemonSetFacts.from_manifest(d) for d in record.daemonsets),
        failed_creates=dict(record.failed_creates),
    )


def valid_name(name: str) -> bool:
    """A DNS subdomain: what Kubernetes allows as a node, namespace or ConfigMap name."""
    try:
        check_dns_subdomain(name)
    except FieldProblem:
        return False
    return True


def _is_configmap_name(key: str) -> bool:
    namespace, slash, name = key.partition("/")
    return bool(slash) and valid_name(namespace) and valid_name(name)


def strings(value: Mapping[str, str | None]) -> dict[str, str]:
    """A recorded string map, a null value read as empty."""
    return {k: "" if v is None else v for k, v in value.items()}
