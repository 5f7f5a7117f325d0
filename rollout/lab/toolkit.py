"""The NVIDIA container toolkit of a lab node: its unit and script, installed at node creation.

The script (rollout/lab/data/toolkit/nvidia-toolkit) does what the GPU Operator's toolkit
container does in daemon mode: on start it copies the CRI runtime table of `containerd
config dump` into conf.d/99-nvidia.toml with the nvidia, nvidia-cdi and nvidia-legacy
handlers and SIGHUPs containerd (systemd restarts it); on stop it deletes the drop-in and
signals again. The unit is not enabled: the simulated kubelet starts it when the node's
toolkit DaemonSet pod starts and stops it when that pod goes, and a node's shutdown stops
it, so a reboot leaves no drop-in until the toolkit pod runs again.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

TOOLKIT_UNIT = "nvidia-container-toolkit.service"
TOOLKIT_SCRIPT = "/usr/local/nvidia/toolkit/nvidia-toolkit"
TOOLKIT_UNIT_FILE = f"/etc/systemd/system/{TOOLKIT_UNIT}"
TOOLKIT_DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
_DATA = ("data", "toolkit")


def toolkit_script_text() -> str:
    """The toolkit script a node runs (stdlib Python 3 only)."""
    return resources.files("rollout.lab").joinpath(*_DATA, "nvidia-toolkit").read_text()


def toolkit_unit_text() -> str:
    return resources.files("rollout.lab").joinpath(*_DATA, TOOLKIT_UNIT).read_text()


def install_toolkit(root: Path) -> None:
    """Write the toolkit's script and unit into a node's root filesystem (not enabled)."""
    for node_path, text, mode in (
        (TOOLKIT_SCRIPT, toolkit_script_text(), 0o755),
        (TOOLKIT_UNIT_FILE, toolkit_unit_text(), 0o644),
    ):
        path = root / node_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
