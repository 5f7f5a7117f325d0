"""The NVIDIADriver resources, read live (a `mode: operator` plan whose change names one reads
them: rollout.facts.live decides; each node's running kernel is read with the other extra node
facts, rollout.facts.extra)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout.transports.errors import NotFound
from rollout.transports.kube import KubeClient


def read_nvidia_drivers(kube: KubeClient) -> dict[str, Mapping[str, Any]]:
    """Every NVIDIADriver's spec by name; none where the cluster serves no such kind."""
    try:
        found = kube.list_nvidia_drivers()
    except NotFound:  # no NVIDIADriver CRD: the plan says the resource is not there
        return {}
    return {str(d["metadata"]["name"]): dict(d.get("spec") or {}) for d in found}
