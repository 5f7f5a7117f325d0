"""The stand-in NVIDIA kernel-module state of a lab node, and the programs that use it.

A lab node shares the host's kernel and has no GPU, so what a driver upgrade touches below
the packages is simulated inside the node, by programs the node runs as the real ones:

- `modprobe`, `rmmod`, `lsmod`, `modinfo` in /usr/local/sbin (ahead of /usr/sbin on PATH):
  for nvidia, nvidia_modeset, nvidia_drm and nvidia_uvm they change or show the loaded-module
  state (MODULE_VERSION_FILE for nvidia, MODULES_DIR for the others, under /var/lib so the
  control plane's simulated driver container can write it from the host); other module
  names go to the real kmod tools.
- rollout-lab-nvidia-modules.service forgets that state and loads the installed driver
  version at every boot, so a reboot re-derives it from the installed package.
- nvidia-persistenced.service and nvidia-fabricmanager.service run the GPU-client stand-in,
  which keeps the module in use while it runs (on every node: lab.json has no NVSwitch
  notion, and the lab's GPUs are SXM parts, which sit on NVSwitch baseboards).
- rollout-lab-operands.service runs a GPU-client stand-in per GPU operand pod the lab's
  kubelet runs on the node (rollout.lab.simulation.operandholders), so pausing the operands
  is what frees the module.
- the stand-in `nvidia-smi` compares the loaded nvidia module's version with the library's.

Files come from rollout/lab/data (nvidia-kmod, nvidia-client, driver/units/) and are written
into the node's overlay when the node is created, as /usr/bin/nvidia-smi already is.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

# The loaded nvidia module's version: the file the stand-in nvidia-smi compares with its
# library and `rollout lab break driver-library-mismatch` overwrites. Absent: not loaded.
MODULE_VERSION_FILE = "/var/lib/rollout-lab/nvidia-module-version"
MODULES_DIR = "/var/lib/rollout-lab/nvidia-modules"
# Runtime only: the control device GPU clients hold open, and the lock of the state.
STATE_DIR = "/run/rollout-lab/nvidia"
CONTROL_DEVICE = f"{STATE_DIR}/nvidiactl"
MODULES = ("nvidia", "nvidia_modeset", "nvidia_drm", "nvidia_uvm")
KMOD_PROGRAM = "/usr/lib/rollout-lab/nvidia-kmod"
KMOD_TOOLS = ("modprobe", "rmmod", "lsmod", "modinfo")
STAND_IN_DIR = "/usr/local/sbin"
CLIENT_PROGRAM = "/usr/lib/rollout-lab/nvidia-client"
CLIENTS = ("/usr/bin/nvidia-persistenced", "/usr/bin/nv-fabricmanager")
OPERANDS_PROGRAM = "/usr/lib/rollout-lab/nvidia-operands"
LOAD_UNIT = "rollout-lab-nvidia-modules.service"
OPERANDS_UNIT = "rollout-lab-operands.service"
PERSISTENCED_UNIT = "nvidia-persistenced.service"
FABRICMANAGER_UNIT = "nvidia-fabricmanager.service"
# unit -> the target whose .wants/ enables it
UNITS = {
    LOAD_UNIT: "sysinit.target",
    PERSISTENCED_UNIT: "multi-user.target",
    FABRICMANAGER_UNIT: "multi-user.target",
    OPERANDS_UNIT: "multi-user.target",
}
UNIT_DIR = "/usr/lib/systemd/system"


def install_driver_stand_ins(root: Path) -> None:
    """Write the module tools, the GPU-client stand-in and the units into a node's root."""
    _write(root, KMOD_PROGRAM, _data("nvidia-kmod"), 0o755)
    for tool in KMOD_TOOLS:
        _symlink(root, f"{STAND_IN_DIR}/{tool}", KMOD_PROGRAM)
    _write(root, CLIENT_PROGRAM, _data("nvidia-client"), 0o755)
    for client in CLIENTS:
        _symlink(root, client, CLIENT_PROGRAM)
    _write(root, OPERANDS_PROGRAM, _data("nvidia-operands"), 0o755)
    for unit, target in UNITS.items():
        _write(root, f"{UNIT_DIR}/{unit}", _data(f"driver/units/{unit}"), 0o644)
        _symlink(root, f"/etc/systemd/system/{target}.wants/{unit}", f"{UNIT_DIR}/{unit}")


def _write(root: Path, node_path: str, text: str, mode: int) -> None:
    path = root / node_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _symlink(root: Path, node_path: str, target: str) -> None:
    path = root / node_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def _data(name: str) -> str:
    return resources.files("rollout.lab").joinpath("data", name).read_text()
