"""MIG as a node's state, whoever put its GPUs in MIG mode: what GPU feature discovery's labels
and the device plugin's resources say of it. Every change meets it (a registry mirror on a
node an operator partitioned with `kubectl label ... nvidia.com/mig.config=...`); the MIG
change kind is only one way a node gets there, and this module knows nothing of it.

Under the ClusterPolicy's `mig.strategy: mixed` the device plugin advertises each MIG profile
as `nvidia.com/mig-<profile>` and GFD labels `nvidia.com/mig-<profile>.count`; under `single`
it advertises the MIG devices as `nvidia.com/gpu`, and GFD labels `nvidia.com/mig.strategy=
single` and overrides `nvidia.com/gpu.product` with `<product>-MIG-<profile>` and
`nvidia.com/gpu.count` with the MIG devices' count (FACTS.md, MIG manager; GFD's README,
"Generated Labels"). GFD writes its labels whole, so a layout put back to all-disabled leaves
none of them behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from rollout.operatornames import MIG_RESOURCE_PREFIX

STRATEGY_LABEL = "nvidia.com/mig.strategy"
PRODUCT_LABEL = "nvidia.com/gpu.product"
# what GFD puts between the GPU's model and the MIG profile under the single strategy
SINGLE_PRODUCT_MARK = "-MIG-"
_COUNT_SUFFIX = ".count"


class MigMode(Enum):
    """Whether some GPU of the node is in MIG mode, and how the device plugin advertises it."""

    OFF = "off"
    SINGLE = "single"
    MIXED = "mixed"


def read_mig_mode(labels: Mapping[str, str], allocatable: Mapping[str, str]) -> MigMode:
    """The node's MIG mode from its labels and allocatable: mixed where GFD counts, or the node
    offers, a `nvidia.com/mig-<profile>` device; single where GFD's product label names a MIG
    profile; else off. Allocatable, not capacity: the kubelet keeps a gone resource's capacity
    for minutes (FACTS.md, kubelet device manager), a layout put back to all-disabled too."""
    if any(_is_mig_resource(name, count) for name, count in allocatable.items()) or any(
        key.startswith(MIG_RESOURCE_PREFIX) and key.endswith(_COUNT_SUFFIX) for key in labels
    ):
        return MigMode.MIXED
    if SINGLE_PRODUCT_MARK in labels.get(PRODUCT_LABEL, ""):
        return MigMode.SINGLE
    return MigMode.OFF


def _is_mig_resource(name: str, count: str) -> bool:
    return name.startswith(MIG_RESOURCE_PREFIX) and count.strip() not in ("", "0")
