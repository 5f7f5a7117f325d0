"""Test support: GPU-node config files as the GPU Operator leaves them, and the toolkit's moves.

The NVIDIA container toolkit (pkg/config/engine/containerd) builds conf.d/99-nvidia.toml from
`containerd config dump`: rollout.containerd.toolkit renders it.
It rewrites the file whenever it starts and deletes it when it exits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomli_w

from rollout.containerd import ConfigFiles
from rollout.containerd.toolkit import render_toolkit_dropin

DATA = Path(__file__).parent / "data"
MAIN = "/etc/containerd/config.toml"
CONF_D = "/etc/containerd/conf.d"
NVIDIA_DROPIN = f"{CONF_D}/99-nvidia.toml"
REGISTRY_DROPIN = f"{CONF_D}/registry.toml"
EARLY_REGISTRY_DROPIN = f"{CONF_D}/00-registry.toml"
CERTS_D = "/etc/containerd/certs.d"

# What a naive operator writes to point CRI at certs.d: the incident's drop-in.
NAIVE_REGISTRY = f"""# point CRI at certs.d
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "{CERTS_D}"
"""


def main_config(config_version: int) -> str:
    """The node image's main config: imports conf.d, runc with the systemd cgroup driver."""
    plugin = "io.containerd.grpc.v1.cri" if config_version == 2 else "io.containerd.cri.v1.runtime"
    return f"""# Node image containerd config. The GPU Operator adds conf.d/99-nvidia.toml.
version = {config_version}
imports = ["{CONF_D}/*.toml"]

[plugins."{plugin}".containerd]
  default_runtime_name = "runc"

  [plugins."{plugin}".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

    [plugins."{plugin}".containerd.runtimes.runc.options]
      SystemdCgroup = true  # kubelet uses the systemd cgroup driver
"""


def toolkit_dropin(dump: dict[str, Any]) -> str:
    """99-nvidia.toml as the toolkit writes it from a `config dump`."""
    return tomli_w.dumps(render_toolkit_dropin(dump))


def recorded_node(name: str) -> ConfigFiles:
    """A node's /etc/containerd recorded under tests/containerd/data/<name>."""
    return ConfigFiles.from_directory(DATA / name)
