"""What each node's plan was made from, as named digests: one sha256 per fact a reviewer
could name (a file, containerd's version, a label, the driver, the ClusterPolicy).

A saved plan keeps these; `rollout apply FILE` reads the node again before touching it and
compares, so a node whose facts moved since the review is refused by name, fact and digest.
Facts that change on their own (the service's MainPID, allocatable GPUs, pods, readiness)
are left out: the plan is not made from them, and the steps check them live.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.facts import ClusterFacts, NodeFacts

# Labels a run or the GPU Operator moves on nodes that have not started yet (the upgrade
# controller's state and skip labels, GFD's driver labels): compared only until this run's
# first cluster-wide change, like the cluster's objects.
MOVING_LABEL_PREFIXES = ("nvidia.com/gpu-driver-upgrade", "nvidia.com/cuda.", "nvidia.com/gfd.")

CONTAINERD_DIR = "/etc/containerd/"


def digest_text(text: str) -> str:
    """sha256 of a text, as saved plans write digests."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def digest_data(value: Any) -> str:
    """sha256 of plain data, keys sorted (the same data gives the same digest)."""
    return digest_text(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str))


def fact_name_of_file(path: str) -> str:
    """A containerd file as a reviewer names it: relative to /etc/containerd when below it."""
    return path.removeprefix(CONTAINERD_DIR) if path.startswith(CONTAINERD_DIR) else path


def node_digests(node: NodeFacts) -> dict[str, str]:
    """The named digests of what a node's plan was made from (its own facts)."""
    digests = {"containerd version": digest_text(str(node.containerd))}
    for path, text in node.config_files.files.items():
        digests[fact_name_of_file(path)] = digest_text(text)
    for key, value in node.labels.items():
        digests[f"label {key}"] = digest_text(value)
    if node.driver_host is not None:
        host = node.driver_host
        digests["driver"] = digest_data(
            {
                "driver": str(host.driver),
                "kernel": host.kernel,
                "packages": {name: str(p) for name, p in host.packages.items()},
                "held": list(host.held),
            }
        )
    return digests


def cluster_digests(cluster: ClusterFacts) -> dict[str, str]:
    """The named digests of the cluster-wide objects plans are made from."""
    digests = {"ClusterPolicy": digest_data(dict(cluster.cluster_policy))}
    for name, data in cluster.configmaps.items():
        digests[f"ConfigMap {name}"] = digest_data(dict(data))
    for name, spec in cluster.nvidia_drivers.items():
        digests[f"NVIDIADriver {name}"] = digest_data(dict(spec))
    return digests


def is_moving(fact: str) -> bool:
    """A fact this run (or the operator, during it) may change before a node starts."""
    return fact.startswith("label ") and fact.removeprefix("label ").startswith(
        MOVING_LABEL_PREFIXES
    )


@dataclass(frozen=True)
class FactChanged:
    """One fact whose digest differs from the saved one (None: the fact is gone or new)."""

    fact: str
    saved: str | None
    now: str | None

    def describe(self) -> str:
        if self.now is None:
            what = "is gone"
        elif self.saved is None:
            what = "appeared"
        else:
            what = "changed"
        return (
            f"{self.fact} {what} since the plan was saved "
            f"(saved {self.saved or 'absent'}, now {self.now or 'absent'})"
        )


def compare_digests(
    saved: Mapping[str, str], now: Mapping[str, str], *, moving_too: bool = True
) -> list[FactChanged]:
    """Every fact whose digest moved, in name order; `moving_too` False leaves out the facts
    this run itself may have changed already."""
    changed = [
        FactChanged(fact, saved.get(fact), now.get(fact))
        for fact in sorted(saved.keys() | now.keys())
        if saved.get(fact) != now.get(fact)
    ]
    return [c for c in changed if moving_too or not is_moving(c.fact)]
