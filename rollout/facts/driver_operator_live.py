"""Facts gathered live for `mode: operator` plans: each node's running kernel, which the plan
shows beside the driver's from -> to (the operator's driver container builds its module for it),
and the NVIDIADriver resources where the change names one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollout.commands import CommandRunner
from rollout.facts.driver import DriverKernelFact
from rollout.facts.extra import with_node_fact
from rollout.facts.fact import read_fact
from rollout.facts.model import NodeFacts
from rollout.spec import DriverMode, Spec
from rollout.transports.errors import NotFound
from rollout.transports.kube import KubeClient


def with_operator_kernels(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    nodes: Sequence[NodeFacts],
    max_parallel: int = 8,
) -> list[NodeFacts]:
    """The nodes with their kernel read (`driver_kernel`), where the spec upgrades the GPU
    Operator's driver; unchanged otherwise. A node that cannot be read fails the gathering."""
    change = spec.driver_upgrade
    if change is None or change.mode is not DriverMode.OPERATOR:
        return list(nodes)
    return with_node_fact(
        nodes,
        runners,
        "driver_kernel",
        lambda runner: read_fact(runner, DriverKernelFact()),
        "the nodes' kernels",
        max_parallel,
    )


def read_nvidia_drivers(spec: Spec, kube: KubeClient) -> dict[str, Mapping[str, Any]]:
    """Every NVIDIADriver's spec by name, where the spec's change names one (the plan refuses
    a name not among them, listing those present); none where the cluster serves no such kind."""
    change = spec.driver_upgrade
    if change is None or change.nvidiadriver is None:
        return {}
    try:
        found = kube.list_nvidia_drivers()
    except NotFound:  # no NVIDIADriver CRD: the plan says the resource is not there
        return {}
    return {str(d["metadata"]["name"]): dict(d.get("spec") or {}) for d in found}
