"""What the GPU Operator restarts when rollout changes its ClusterPolicy, said in the plan and
in the run's output.

The operator renders each operand's DaemonSet from the sections of the spec its transform
reads and writes it only when that rendering changes (the `nvidia.com/last-applied-hash` of
the rendered DaemonSet; source: NVIDIA/gpu-operator controllers/object_controls.go). So a
ClusterPolicy change restarts exactly the operands whose transform reads what changed:

- `devicePlugin` (`TransformDevicePlugin`, and GPU feature discovery, which mounts the same
  config): their pods restart on every GPU node; containerd is not restarted.
- `driver.version`: the driver DaemonSet is OnDelete; its pods change only when the upgrade
  controller restarts them, node by node.
- `toolkit`, `cdi`, `operator`, `daemonsets`, the validator's image (`TransformToolkit`,
  `preProcessDaemonSet`): the toolkit pods restart, and each restarts containerd twice on
  its node (its old pod deletes the drop-in and signals containerd, the new one writes it
  and signals again): nodes go NotReady for containerd's RestartSec.
"""

from __future__ import annotations

from collections.abc import Iterable

# The spec sections the toolkit's DaemonSet is rendered from.
TOOLKIT_SECTIONS = frozenset({"toolkit", "cdi", "operator", "daemonsets", "validator"})


def describe_rolls(changed: Iterable[str]) -> str:
    """What the operator restarts for a change of these spec paths (dotted, e.g.
    `devicePlugin.config.name`), containerd restarts named."""
    sections = {path.split(".")[0] for path in changed}
    said: list[str] = []
    if sections & {"devicePlugin", "mig"}:
        said.append(
            "the GPU Operator restarts the device plugin and GPU feature discovery pods on "
            "every GPU node (a DaemonSet rollout)"
        )
    if "driver" in sections:
        said.append(
            "the driver DaemonSet is OnDelete: driver pods change only as the upgrade "
            "controller restarts them, node by node"
        )
    if sections & TOOLKIT_SECTIONS:
        said.append(
            "the GPU Operator restarts the container toolkit on every GPU node, and each "
            "toolkit restart restarts containerd twice on its node (drop-in removed, then "
            "written again)"
        )
    else:
        said.append("containerd is not restarted by it (the toolkit's DaemonSet is unchanged)")
    return "; ".join(said)
