"""What the lab's MIG manager pod writes to its log, in the real manager's words: the
`nvidia-mig-manager` container's main loop and the reconfigure-mig.sh it runs for each new
`nvidia.com/mig.config` label (NVIDIA/mig-parted, deployments/gpu-operator).

Each function gives the lines of one step of migmanager.MigManager; `kubectl logs` of the
node's manager pod, and rollout's mig.wait quoting its tail, read them.
"""

from __future__ import annotations

from rollout.lab.simulation.miglayouts import STATE_LABEL

APPLIED = "MIG configuration applied successfully"
UNABLE_TO_APPLY = "Unable to apply MIG config"
RESTARTING_CLIENTS = (
    "Restarting all GPU clients previously shutdown in Kubernetes by reenabling their "
    "component-specific nodeSelector labels"
)


def state_line(state: str) -> str:
    return f"Changing the '{STATE_LABEL}' node label to '{state}'"


def to_start_lines(config: str) -> list[str]:
    """A new label taken up: the configuration file asserted to hold it."""
    return [
        f"Updating to MIG config: {config}",
        "Asserting that the requested configuration is present in the configuration file",
    ]


def to_invalid_lines(config: str, error: str) -> list[str]:
    """The layout is unknown to the ConfigMap or does not fit the node's GPUs."""
    return [
        f"Error: {error}",
        "Unable to validate the selected MIG configuration",
        state_line("failed"),
        f"Error: unable to update to MIG config {config}: exit status 1",
    ]


def to_valid_lines(applied: bool) -> list[str]:
    """The layout is valid; whether the GPUs already are it."""
    lines = [
        "Selected MIG configuration is valid",
        "Checking if the selected MIG config is currently applied or not",
    ]
    if applied:
        lines.append("Selected MIG configuration currently applied")
    return lines


def to_pausing_lines() -> list[str]:
    return [
        state_line("pending"),
        "Shutting down all GPU clients in Kubernetes by disabling their component-specific "
        "nodeSelector labels",
        "Waiting for the device-plugin to shutdown",
        "Waiting for the operator-validator to shutdown",
    ]


def to_applying_lines() -> list[str]:
    return [
        "Applying the MIG mode change from the selected config to the node (and double "
        "checking it took effect)",
        "Applying the selected MIG config to the node",
    ]


def to_reboot_lines() -> list[str]:
    return [
        "MIG mode change did not take effect: the node needs a reboot",
        state_line("rebooting"),
        "Rebooting the node to finish applying the MIG mode change",
    ]


def to_failed_lines(config: str, error: str) -> list[str]:
    """Applying the layout failed: the GPUs are left as they were."""
    return [
        f"Error: {error}",
        UNABLE_TO_APPLY,
        RESTARTING_CLIENTS,
        state_line("failed"),
        f"Error: unable to update to MIG config {config}: exit status 1",
    ]


def to_success_lines(config: str, restarted_clients: bool) -> list[str]:
    lines = [RESTARTING_CLIENTS] if restarted_clients else []
    return [
        *lines,
        state_line("success"),
        APPLIED,
        f"Successfully updated to MIG config: {config}",
        "Waiting for change to 'nvidia.com/mig.config' label",
    ]
