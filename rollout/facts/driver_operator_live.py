"""The NVIDIADriver resources a `mode: operator` plan reads live, where its change names one
(each node's running kernel is read with the other extra node facts, rollout.facts.extra)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout.changes.driver.model import DriverUpgradeChange
from rollout.spec import Spec
from rollout.transports.errors import NotFound
from rollout.transports.kube import KubeClient


def read_nvidia_drivers(spec: Spec, kube: KubeClient) -> dict[str, Mapping[str, Any]]:
    """Every NVIDIADriver's spec by name, where the spec's change names one (the plan refuses
    a name not among them, listing those present); none where the cluster serves no such kind."""
    change = spec.change_of(DriverUpgradeChange)
    if change is None or change.nvidiadriver is None:
        return {}
    try:
        found = kube.list_nvidia_drivers()
    except NotFound:  # no NVIDIADriver CRD: the plan says the resource is not there
        return {}
    return {str(d["metadata"]["name"]): dict(d.get("spec") or {}) for d in found}
