"""Test support: GPU-node config files as the GPU Operator leaves them, and the toolkit's moves.

The NVIDIA container toolkit (pkg/config/engine/containerd) builds conf.d/99-nvidia.toml from
`containerd config dump`: for config version 2 (containerd 1.x) the drop-in holds a copy of
the entire CRI table with runtimes nvidia, nvidia-cdi and nvidia-legacy added (options copied
from runc, BinaryName under /usr/local/nvidia/toolkit); for version 3 (2.x) only the runtimes.
It rewrites the file whenever it starts and deletes it when it exits.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import tomli_w

from rollout.containerd import ConfigFiles

DATA = Path(__file__).parent / "data"
MAIN = "/etc/containerd/config.toml"
CONF_D = "/etc/containerd/conf.d"
NVIDIA_DROPIN = f"{CONF_D}/99-nvidia.toml"
REGISTRY_DROPIN = f"{CONF_D}/registry.toml"
EARLY_REGISTRY_DROPIN = f"{CONF_D}/00-registry.toml"
TOOLKIT_DIR = "/usr/local/nvidia/toolkit"
HANDLERS = {"nvidia": "", "nvidia-cdi": ".cdi", "nvidia-legacy": ".legacy"}
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
    plugins = dump["plugins"]
    if dump.get("version", 2) >= 3:
        runtimes = plugins["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
        added = {name: _handler(runtimes, suffix) for name, suffix in HANDLERS.items()}
        body = {"containerd": {"runtimes": added}}
        return tomli_w.dumps({"version": 3, "plugins": {"io.containerd.cri.v1.runtime": body}})
    cri = copy.deepcopy(plugins["io.containerd.grpc.v1.cri"])
    runtimes = cri["containerd"]["runtimes"]
    for name, suffix in HANDLERS.items():
        runtimes[name] = _handler(runtimes, suffix)
    return tomli_w.dumps({"version": 2, "plugins": {"io.containerd.grpc.v1.cri": cri}})


def _handler(runtimes: dict[str, Any], suffix: str) -> dict[str, Any]:
    handler = copy.deepcopy(runtimes.get("runc", {"runtime_type": "io.containerd.runc.v2"}))
    handler.setdefault("options", {})["BinaryName"] = (
        f"{TOOLKIT_DIR}/nvidia-container-runtime{suffix}"
    )
    return handler


def recorded_node(name: str) -> ConfigFiles:
    """A node's /etc/containerd recorded under tests/containerd/data/<name>."""
    return ConfigFiles.from_directory(DATA / name)
