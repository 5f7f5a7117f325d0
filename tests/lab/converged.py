"""What the example plan leaves on a lab once applied, read back from the nodes and the API
as an operator would check it."""

from __future__ import annotations

import tomllib
from typing import Any

from rollout.lab.cluster import Lab
from rollout.transports.kube import KubeClient
from tests.lab.test_cluster_shared import ssh_check

HANDLERS = {"nvidia", "nvidia-cdi", "nvidia-legacy"}


def dump_of(lab: Lab, name: str) -> dict[str, Any]:
    """`containerd config dump` on the node called `name`, parsed."""
    node = next(n for n in lab.nodes if n.name == name)
    dump = tomllib.loads(ssh_check(lab, node, ["containerd", "config", "dump"]))
    dump.pop("imports", None)  # 1.x prints the resolved imports in no fixed order
    return dump


def handlers_and_config_path(dump: dict[str, Any]) -> tuple[set[str], str]:
    """The CRI runtime handlers and the registry config_path, from either CRI layout."""
    plugins = dump["plugins"]
    if "io.containerd.cri.v1.runtime" in plugins:
        runtimes = plugins["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
        path = plugins["io.containerd.cri.v1.images"]["registry"]["config_path"]
    else:
        cri = plugins["io.containerd.grpc.v1.cri"]
        runtimes, path = cri["containerd"]["runtimes"], cri["registry"]["config_path"]
    return set(runtimes), str(path)


def assert_converged(lab: Lab, kube: KubeClient) -> None:
    """Every node has the plan's handlers and mirror, advertises its GPUs and is schedulable."""
    for spec in lab.nodes:
        handlers, path = handlers_and_config_path(dump_of(lab, spec.name))
        assert handlers >= HANDLERS, spec.name
        assert path == "/etc/containerd/certs.d", spec.name
        ssh_check(lab, spec, ["test", "-f", "/etc/containerd/certs.d/docker.io/hosts.toml"])
        node = kube.get_node(spec.name)
        assert node.allocatable.get("nvidia.com/gpu") == str(len(spec.gpus)), spec.name
        assert not node.unschedulable, spec.name
