"""Proving a node's reboot: a new boot_id over SSH, then containerd active, then the node
Ready. Shared by the kinds whose change reboots a node: the driver's host steps request the
reboot themselves, the MIG manager reboots a node for a layout that needs it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rollout.commands import CommandRunner, CommandTimeout
from rollout.driver.modules import BootIdFact
from rollout.errors import RolloutError, TransientError
from rollout.facts import read_fact
from rollout.steps.deadline import Deadline
from rollout.steps.systemd import probe_service

REBOOT_POLL_S = 2.0


class RebootNotProven(RolloutError):
    """The node did not come back from its reboot within the time; the message names the stage."""


@dataclass(frozen=True)
class Rebooted:
    boot_before: str
    boot_after: str
    waited_s: float

    def describe(self) -> str:
        return (
            f"rebooted (boot_id {self.boot_before[:8]} -> {self.boot_after[:8]}) in "
            f"{round(self.waited_s)}s; SSH, containerd and the node are back"
        )


def read_boot_id(runner: CommandRunner) -> str | None:
    """The boot id, or None while the node cannot be reached (it is rebooting)."""
    try:
        return read_fact(runner, BootIdFact())
    except (TransientError, CommandTimeout):
        return None


def wait_for_reboot(
    runner: CommandRunner,
    boot_before: str,
    timeout_s: float,
    node_ready: Callable[[], bool],
    sleep: Callable[[float], None],
) -> Rebooted:
    """Wait, within timeout_s, for a new boot_id over SSH, containerd active, the node Ready.

    RebootNotProven names the stage that did not come within the time.
    """
    deadline = Deadline(timeout_s, sleep)
    stage = "a new boot_id over SSH (the node did not come back)"
    boot_after: str | None = None
    while True:
        try:
            if boot_after is None:
                now = read_boot_id(runner)
                if now is not None and now != boot_before:
                    boot_after = now
                    stage = "containerd active after the boot"
            if (
                boot_after is not None
                and stage.startswith("containerd")
                and probe_service(runner).running
            ):
                stage = "the node Ready in the Kubernetes API"
            if boot_after is not None and stage.startswith("the node") and node_ready():
                return Rebooted(boot_before, boot_after, deadline.elapsed_s)
        except (TransientError, CommandTimeout):
            pass  # still booting
        if deadline.expired:
            raise RebootNotProven(
                f"waited {timeout_s:g}s (policy.driver.reboot_timeout_s) for {stage} "
                f"after `systemctl reboot` (boot_id before: {boot_before})"
            )
        deadline.sleep(REBOOT_POLL_S)
