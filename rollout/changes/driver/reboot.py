"""Rebooting a node for its driver, resumably: the boot_id before is saved first, the reboot
is proven by a new one, then SSH, containerd and the node Ready (rollout.steps.reboot)."""

from __future__ import annotations

from rollout.changes.driver.node import read_driver, request_reboot
from rollout.commands import CommandTimeout
from rollout.driver.modules import BootIdFact
from rollout.errors import TransientError
from rollout.facts import read_fact
from rollout.steps.base import StepContext
from rollout.steps.reboot import read_boot_id, wait_for_reboot


def reboot_node(ctx: StepContext, kind: str, key: str) -> str:
    """Reboot once per (step, key), prove it and wait for the node; resumable: the boot_id
    before is saved first, and a resumed run that finds a new one only waits."""
    data = ctx.load_data(kind)
    record = dict(data.get(key) or {})
    if record.get("boot_after"):
        return f"rebooted before (boot_id {str(record['boot_after'])[:8]})"
    if "boot_before" not in record:
        record["boot_before"] = read_fact(ctx.runner, BootIdFact())
        ctx.save_data(kind, {**data, key: record})
    before = str(record["boot_before"])
    if read_boot_id(ctx.runner) == before:
        request_reboot(ctx.runner)  # again on a resumed run: harmless while going down
    ctx.progress(f"{ctx.node}: {kind}: rebooting (systemctl reboot)")
    rebooted = wait_for_reboot(
        ctx.runner,
        before,
        float(ctx.spec.policy.driver.reboot_timeout_s),
        lambda: ctx.kube.get_node(ctx.node).ready,
        ctx.sleep,
    )
    ctx.save_data(kind, {**ctx.load_data(kind), key: {**record, "boot_after": rebooted.boot_after}})
    return rebooted.describe()


def describe_until_reboot(ctx: StepContext) -> str:
    """The driver as nvidia-smi reports it before the reboot; a resumed run may find the
    node already going down."""
    try:
        return read_driver(ctx.runner).describe()
    except (TransientError, CommandTimeout):
        return "nvidia-smi could not be asked (the node is already rebooting)"
