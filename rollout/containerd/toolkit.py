"""The NVIDIA container toolkit's containerd drop-in, as the toolkit writes it.

The toolkit (pkg/config/engine/containerd) builds conf.d/99-nvidia.toml from `containerd
config dump`: the drop-in starts as a copy of the ENTIRE plugin table that holds the runtimes
(containerd 1.x replaces whole plugin tables, so a partial table would lose the rest), then
adds the handlers nvidia, nvidia-cdi and nvidia-legacy, each a copy of the default runtime
with BinaryName under /usr/local/nvidia/toolkit. It rewrites the file whenever it starts and
deletes it when it exits. The lab builds its nodes with this, and the tests replay a toolkit
restart with it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from rollout.containerd.errors import UnsupportedVersion
from rollout.containerd.version import RUNTIME_PLUGIN

TOOLKIT_DIR = "/usr/local/nvidia/toolkit"
# runtime handler -> the BinaryName the toolkit gives it
NVIDIA_RUNTIMES = {
    "nvidia": f"{TOOLKIT_DIR}/nvidia-container-runtime",
    "nvidia-cdi": f"{TOOLKIT_DIR}/nvidia-container-runtime.cdi",
    "nvidia-legacy": f"{TOOLKIT_DIR}/nvidia-container-runtime.legacy",
}


def render_toolkit_dropin(dump: Mapping[str, Any]) -> dict[str, Any]:
    """The toolkit's drop-in for a parsed `containerd config dump`, as a TOML tree."""
    version = int(dump.get("version", 2))
    plugin = RUNTIME_PLUGIN.get(version)
    if plugin is None:
        raise UnsupportedVersion(
            f"the toolkit writes drop-ins for config versions 2 and 3, not {version}"
        )
    table = copy.deepcopy(dict(dump.get("plugins", {}).get(plugin, {})))
    containerd = table.setdefault("containerd", {})
    runtimes = containerd.setdefault("runtimes", {})
    default_name = containerd.get("default_runtime_name") or "runc"
    template = (
        runtimes.get(default_name)
        or runtimes.get("runc")
        or {"runtime_type": "io.containerd.runc.v2"}
    )
    for name, binary in NVIDIA_RUNTIMES.items():
        runtime = copy.deepcopy(template)
        runtime.setdefault("options", {})["BinaryName"] = binary
        runtimes[name] = runtime
    return {"version": version, "plugins": {plugin: table}}
