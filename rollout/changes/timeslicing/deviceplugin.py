"""The node's device-plugin pod: restart it, wait for it to be ready again (finding the node's
device-plugin pods is shared: gpu.wait reads them, rollout.steps.pods)."""

from __future__ import annotations

from rollout.steps.base import StepContext, StepFailed
from rollout.steps.deadline import POLL_INTERVAL_S
from rollout.steps.pods import describe_pod, find_device_plugin_pods
from rollout.transports.kube import Pod


def live_device_plugin(ctx: StepContext) -> Pod | None:
    """The node's live device-plugin pod; None while the DaemonSet replaces a failed or
    deleted one (its next pod loads the node's profile as it is now)."""
    live = [p for p in find_device_plugin_pods(ctx) if not p.deleting]
    return live[0] if live else None


def find_device_plugin(ctx: StepContext, kind: str) -> Pod:
    """The node's live device-plugin pod; StepFailed when there is none."""
    live = live_device_plugin(ctx)
    if live is None:
        raise StepFailed(ctx.node, kind, "no device-plugin pod on the node to restart")
    return live


def wait_for_device_plugin(ctx: StepContext, kind: str, deleted_uid: str) -> Pod:
    """Wait until a device-plugin pod other than `deleted_uid` runs on the node and is ready."""
    deadline = ctx.deadline(ctx.spec.policy.verify.gpu_wait_timeout_s)
    while True:
        pods = find_device_plugin_pods(ctx)
        ready = [
            p
            for p in pods
            if p.uid != deleted_uid and not p.deleting and p.phase == "Running" and p.ready
        ]
        if ready:
            return ready[0]
        if deadline.expired:
            state = "; ".join(describe_pod(p) for p in pods) or "no device-plugin pod"
            raise StepFailed(
                ctx.node,
                kind,
                f"the device plugin did not come back within {round(deadline.elapsed_s)}s "
                f"(policy.verify.gpu_wait_timeout_s): {state}",
            )
        deadline.sleep(POLL_INTERVAL_S)


def restart_device_plugin(ctx: StepContext, kind: str) -> Pod:
    """Delete the node's device-plugin pod and wait for its replacement to be ready."""
    old = find_device_plugin(ctx, kind)
    ctx.kube.delete_pod(old.namespace, old.name, missing_ok=True)
    return wait_for_device_plugin(ctx, kind, old.uid)
