# long module: one job, a time-slicing change: the profile, each node's label, the plugin reload
"""Time-slicing steps: publish a device-plugin profile, select it per node, reload the plugin.

The device plugin's config-manager reacts to node *label* changes only (FACTS.md): a new
profile under a label the node already carries reloads nothing until the plugin pod restarts.
So `configmap.update` records whether this run changed the profile's content,
`node.label` records whether the node already had the label, and `deviceplugin.restart`
acts only when both are true.

`configmap.update` is cluster-wide but runs in a node's context: the first node of a run
changes the ConfigMap, every later node finds it done (a no-op). The ConfigMap itself
carries which run last changed which key (annotations), so a later node, or a resumed run,
still knows the content changed in this run. It publishes what `plan_publication` decides:
the profile and, where the fallback of unlabelled nodes would otherwise move, a `default` key
or `config.default` holding what they run today, so a node's profile changes only when its
own wave labels it (safety invariant 8).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rollout.changes.base import PlanningContext
from rollout.changes.timeslicing.deviceplugin import (
    live_device_plugin,
    restart_device_plugin,
    wait_for_device_plugin,
)
from rollout.changes.timeslicing.model import TimeSlicingChange
from rollout.changes.timeslicing.profiles import (
    SHARED_MEMORY_WARNING,
    ProfileWork,
    Publication,
    plan_publication,
)
from rollout.deviceprofiles import DEVICE_PLUGIN_CONFIG_LABEL, MAX_REPLICAS
from rollout.errors import InputError
from rollout.facts import ClusterFacts, NodeFacts
from rollout.facts.pods import GPU_RESOURCE
from rollout.plan import StepPlan
from rollout.rbac import grants_of
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.nodechanges import node_changes
from rollout.steps.nodemarks import ANNOTATION_DOMAIN, RUN_ANNOTATION, report_step
from rollout.steps.operandsettle import wait_for_operands
from rollout.steps.traits import StepTraits, bounded_by_requests
from rollout.transports.errors import Conflict, NotFound
from rollout.transports.kube import ConfigMap

# Which key of the ConfigMap the run in RUN_ANNOTATION changed.
CHANGED_KEY_ANNOTATION = f"{ANNOTATION_DOMAIN}/changed-key"
CONFLICT_ATTEMPTS = 5


def check_replicas(change: TimeSlicingChange) -> int:
    """The replicas of nvidia.com/gpu, refusing what the plan's validation should have caught."""
    replicas = change.replicas_for(GPU_RESOURCE)
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"replicas of {GPU_RESOURCE} must be 1..{MAX_REPLICAS}, not {replicas}")
    return replicas


def changed_in_run(configmap: ConfigMap | None, run_id: str, key: str) -> bool:
    """Whether the ConfigMap says run `run_id` changed `key` (and nobody changed it since)."""
    if configmap is None:
        return False
    notes = configmap.annotations
    return notes.get(RUN_ANNOTATION) == run_id and notes.get(CHANGED_KEY_ANNOTATION) == key


def get_configmap(ctx: StepContext, change: TimeSlicingChange) -> ConfigMap | None:
    try:
        return ctx.kube.get_configmap(change.configmap.namespace, change.configmap.name)
    except NotFound:
        return None


def get_cluster_policy(ctx: StepContext, kind: str) -> dict[str, Any]:
    """The GPU Operator's ClusterPolicy (there is one per cluster)."""
    policies = ctx.kube.list_cluster_policies()
    if not policies:
        raise StepFailed(
            ctx.node,
            kind,
            "no ClusterPolicy in the cluster: time-slicing needs the GPU Operator installed",
        )
    return policies[0]


def with_keys(
    configmap: ConfigMap, values: Mapping[str, str | None], annotations: Mapping[str, str | None]
) -> ConfigMap:
    """A copy with `values` set (None: removed) and annotations merged (None: removed); every
    other key is kept as it is."""
    data = dict(configmap.data)
    for key, value in values.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    notes = {**configmap.annotations, **annotations}
    return ConfigMap(
        namespace=configmap.namespace,
        name=configmap.name,
        data=data,
        labels=configmap.labels,
        annotations={k: v for k, v in notes.items() if v is not None},
        resource_version=configmap.resource_version,
    )


def read_publication(ctx: StepContext, kind: str) -> tuple[Publication, ConfigMap | None, str]:
    """The publication decided on fresh facts, the ConfigMap read, the ClusterPolicy's name."""
    change = ctx.spec.change_of(TimeSlicingChange)
    assert change is not None
    current = get_configmap(ctx, change)
    policy = get_cluster_policy(ctx, kind)
    ref = f"{change.configmap.namespace}/{change.configmap.name}"
    facts = ClusterFacts(
        configmaps={ref: dict(current.data)} if current is not None else {},
        cluster_policy=dict(policy.get("spec") or {}),
    )
    try:
        publication = plan_publication(ctx.spec, facts)
    except InputError as exc:
        raise StepFailed(ctx.node, kind, str(exc)) from None
    assert publication is not None
    return publication, current, str(policy["metadata"]["name"])


def apply_change(
    ctx: StepContext,
    kind: str,
    body: Callable[[StepContext, TimeSlicingChange], StepResult],
) -> StepResult:
    """Run a step's body on the spec's time-slicing change, marking the node; no change, no-op."""

    def run(ctx: StepContext) -> StepResult:
        change = ctx.spec.change_of(TimeSlicingChange)
        if change is None:
            return StepResult.noop("no time-slicing change")
        return body(ctx, change)

    return report_step(ctx, kind, run)


# ------------------------------------------------------------------------ configmap.update


@dataclass(frozen=True)
class ConfigMapUpdateStep:
    """Publish the profile (and the fallback unlabelled nodes keep) and point the ClusterPolicy
    at the ConfigMap: `plan_publication`, on fresh facts, is what it does.

    Saved data: configmap; previous_keys (each key this run wrote: its old text, None when
    absent) with previous (the profile key's); key_changed; content_changed (this run changed
    the profile, here or on another node); policy_before (each ClusterPolicy
    `devicePlugin.config` field this run set: its old value) with policy_name_before;
    policy_changed.
    """

    kind: ClassVar[str] = "configmap.update"
    # the ConfigMap's own namespace is added per change (the kind's `grants`, in kind.py)
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=True,
        takes_down=False,
        uses_ssh=False,
        grants=(
            *grants_of("nvidia.com", "clusterpolicies", "list patch"),
            *grants_of("", "nodes", "get"),
        ),
        expected_s=1.0,
        worst_s=bounded_by_requests,
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        if node_changes(ctx, facts).cluster_pending:
            # cluster-wide: the first node's step makes the change, later ones find it made
            return StepPlan.acting(
                self.kind,
                "publish the profile in the ConfigMap, unlabelled nodes keeping what they run, "
                "and point the ClusterPolicy at it",
            )
        return StepPlan.skipping(
            self.kind, "the ConfigMap and the ClusterPolicy already hold the profile"
        )

    def apply(self, ctx: StepContext) -> StepResult:
        return apply_change(ctx, self.kind, self._apply)

    def _apply(self, ctx: StepContext, change: TimeSlicingChange) -> StepResult:
        try:
            replicas = check_replicas(change)
        except ValueError as exc:
            raise StepFailed(ctx.node, self.kind, str(exc)) from None
        ref = f"{change.configmap.namespace}/{change.configmap.name}"
        saved = ctx.load_data(self.kind)
        did: list[str] = []
        for _ in range(CONFLICT_ATTEMPTS):
            # The planner's own decision, on fresh facts: what plan showed is what apply does.
            publication, current, policy_name = read_publication(ctx, self.kind)
            # Saved before any write, so a kill mid-write leaves what undo needs; an earlier
            # attempt's record of an original value is never overwritten.
            previous = dict(saved.get("previous_keys") or {})
            for key in publication.writes:
                previous.setdefault(key, current.data.get(key) if current else None)
            saved |= {"configmap": ref, "previous_keys": previous}
            if change.profile in publication.writes and not saved.get("key_changed"):
                saved |= {"previous": previous[change.profile], "key_changed": True}
            policy_before = dict(saved.get("policy_before") or {})
            for name in publication.policy:
                policy_before.setdefault(name, publication.policy_before.get(name, ""))
            if publication.policy:
                saved |= {
                    "policy_before": policy_before,
                    "policy_name_before": policy_before.get("name", ""),
                    "policy_changed": True,
                }
            ctx.save_data(self.kind, saved)
            changes = {c.kind: c.action for c in publication.to_cluster_changes() if c.action}
            # The ConfigMap first, whole: the ClusterPolicy change restarts every device
            # plugin, and each must find the fallback of unlabelled nodes already there.
            if publication.writes:
                try:
                    self._write(ctx, change, current, publication.writes)
                except Conflict:
                    continue  # changed since it was read: read again, decide again
                did.append(changes.get("configmap") or "")
            if publication.policy:
                ctx.kube.patch_cluster_policy(
                    policy_name,
                    {"spec": {"devicePlugin": {"config": dict(publication.policy)}}},
                )
                # the plan's words: what it sets, and what the GPU Operator then restarts
                did.append(changes.get("clusterpolicy") or "")
                ctx.progress(
                    f"{ctx.node}: configmap.update: {did[-1]}; nodes without the label keep "
                    f"{publication.unlabelled} ({publication.unlabelled_via})"
                )
            break
        else:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"configmap {ref} kept changing under rollout ({CONFLICT_ATTEMPTS} conflicts): "
                "is another tool writing it?",
            )
        current = self._verify(ctx)
        content_changed = bool(saved.get("key_changed")) or changed_in_run(
            current, ctx.run_id, change.profile
        )
        ctx.save_data(self.kind, {**saved, "content_changed": content_changed})
        if saved.get("policy_changed") and not saved.get("settled"):
            # a resumed run whose write went through waits too
            did.append(wait_for_operands(ctx, self.kind, change.configmap.namespace))
            saved["settled"] = True
            ctx.save_data(self.kind, {**saved, "content_changed": content_changed})
        if not did:
            return StepResult.noop(f"key {change.profile!r} already holds this profile")
        # Said once, when the profile is published: slices share one GPU's memory.
        if change.config.sharing:
            ctx.progress(f"{ctx.node}: time-slicing x{replicas}: WARNING: {SHARED_MEMORY_WARNING}")
        return StepResult.done("; ".join(did))

    @staticmethod
    def _write(
        ctx: StepContext,
        change: TimeSlicingChange,
        current: ConfigMap | None,
        writes: Mapping[str, str],
    ) -> None:
        notes = {RUN_ANNOTATION: ctx.run_id, CHANGED_KEY_ANNOTATION: change.profile}
        if change.profile not in writes:
            notes = {}  # only a fallback key: the profile itself is not this run's
        if current is None:
            ctx.kube.create_configmap(
                ConfigMap(
                    namespace=change.configmap.namespace,
                    name=change.configmap.name,
                    data=dict(writes),
                    annotations=notes,
                )
            )
        else:
            ctx.kube.replace_configmap(with_keys(current, writes, notes))

    def _verify(self, ctx: StepContext) -> ConfigMap:
        """Planning again on what the cluster now holds must find nothing left to do."""
        publication, current, _ = read_publication(ctx, self.kind)
        if current is None or publication.pending:
            left = [c.action for c in publication.to_cluster_changes() if c.action]
            raise StepFailed(
                ctx.node,
                self.kind,
                f"after the writes, the cluster still needs: {'; '.join(left)} "
                "(is the GPU Operator or another tool reverting the ConfigMap or the "
                "ClusterPolicy?)",
            )
        return current

    def undo(self, ctx: StepContext) -> None:
        saved = ctx.load_data(self.kind)
        change = ctx.spec.change_of(TimeSlicingChange)
        if change is None or not saved:
            return
        previous: dict[str, str | None] = dict(saved.get("previous_keys") or {})
        if previous:
            for _ in range(CONFLICT_ATTEMPTS):
                current = get_configmap(ctx, change)
                if current is None:
                    break
                ours = changed_in_run(current, ctx.run_id, change.profile)
                notes: dict[str, str | None] = (
                    {RUN_ANNOTATION: None, CHANGED_KEY_ANNOTATION: None} if ours else {}
                )
                try:
                    ctx.kube.replace_configmap(with_keys(current, previous, notes))
                    break
                except Conflict:
                    continue
        if saved.get("policy_changed"):
            policy = get_cluster_policy(ctx, self.kind)
            ctx.kube.patch_cluster_policy(
                policy["metadata"]["name"],
                {"spec": {"devicePlugin": {"config": dict(saved.get("policy_before") or {})}}},
            )
        elif saved.get("key_changed"):
            node = ctx.kube.get_node(ctx.node)
            # The plugin of a node still labelled with the profile keeps the new content
            # until it restarts (label changes reload it on their own; a ClusterPolicy
            # change rolls every plugin).
            if node.labels.get(DEVICE_PLUGIN_CONFIG_LABEL) == change.profile:
                restart_device_plugin(ctx, self.kind)
        ctx.save_data(
            self.kind,
            {**saved, "previous_keys": {}, "key_changed": False, "policy_changed": False},
        )


# ------------------------------------------------------------------------------ node.label


@dataclass(frozen=True)
class NodeLabelStep:
    """Select the profile on the node: nvidia.com/device-plugin.config=<profile>.

    Saved data: previous (the label's old value, None when absent) and changed.
    """

    kind: ClassVar[str] = "node.label"
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=False,
        grants=grants_of("", "nodes", "get patch"),
        expected_s=1.0,
        worst_s=bounded_by_requests,
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        profile = ctx.work_as(facts, "time-slicing", ProfileWork, ProfileWork()).profile
        if profile.label is None:
            return StepPlan.skipping(self.kind, profile.noop_reason or "no label change")
        return StepPlan.acting(self.kind, f"label {profile.label.key}={profile.label.after}")

    def apply(self, ctx: StepContext) -> StepResult:
        return apply_change(ctx, self.kind, self._apply)

    def _apply(self, ctx: StepContext, change: TimeSlicingChange) -> StepResult:
        saved = ctx.load_data(self.kind)
        current = ctx.kube.get_node(ctx.node).labels.get(DEVICE_PLUGIN_CONFIG_LABEL)
        if current == change.profile:
            if saved.get("changed"):
                return StepResult.noop(f"already labelled {change.profile} (by this run)")
            ctx.save_data(self.kind, {"previous": current, "changed": False})
            return StepResult.noop(f"already labelled {change.profile}")
        # A label naming a key the ConfigMap lacks breaks the plugin's config-manager.
        configmap = get_configmap(ctx, change)
        if configmap is None or change.profile not in configmap.data:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"configmap {change.configmap.namespace}/{change.configmap.name} has no key "
                f"{change.profile!r}: configmap.update must run first",
            )
        if not saved.get("changed"):
            ctx.save_data(self.kind, {"previous": current, "changed": True})
        ctx.kube.patch_node_labels(ctx.node, {DEVICE_PLUGIN_CONFIG_LABEL: change.profile})
        after = ctx.kube.get_node(ctx.node).labels.get(DEVICE_PLUGIN_CONFIG_LABEL)
        if after != change.profile:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"label {DEVICE_PLUGIN_CONFIG_LABEL} reads {after!r} after the patch",
            )
        return StepResult.done(
            f"label {DEVICE_PLUGIN_CONFIG_LABEL}={change.profile} (was {current or 'unset'})"
        )

    def undo(self, ctx: StepContext) -> None:
        saved = ctx.load_data(self.kind)
        if not saved.get("changed"):
            return
        previous = saved.get("previous")
        ctx.kube.patch_node_labels(ctx.node, {DEVICE_PLUGIN_CONFIG_LABEL: previous})
        after = ctx.kube.get_node(ctx.node).labels.get(DEVICE_PLUGIN_CONFIG_LABEL)
        if after != previous:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"label {DEVICE_PLUGIN_CONFIG_LABEL} reads {after!r} after restoring {previous!r}",
            )


# -------------------------------------------------------------------- deviceplugin.restart


@dataclass(frozen=True)
class DevicePluginRestartStep:
    """Restart the node's device plugin where only the profile's content changed.

    Saved data: deleted_pod and deleted_uid, written before the delete, so a resumed run
    waits for the replacement instead of deleting that one too.
    """

    kind: ClassVar[str] = "deviceplugin.restart"
    # the device-plugin pod lives in the operator's namespace, whichever that is
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=False,
        grants=grants_of("", "pods", "list delete"),
        expected_s=15.0,
        worst_s=lambda policy: float(policy.verify.gpu_wait_timeout_s),
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        work = ctx.work_as(facts, "time-slicing", ProfileWork, ProfileWork())
        if work.profile.restart_device_plugin:
            return StepPlan.acting(
                self.kind, "delete the node's device-plugin pod so it reloads the profile"
            )
        return StepPlan.skipping(
            self.kind, "the device plugin takes the profile from the label change"
        )

    def apply(self, ctx: StepContext) -> StepResult:
        return apply_change(ctx, self.kind, self._apply)

    def _apply(self, ctx: StepContext, change: TimeSlicingChange) -> StepResult:
        label = ctx.load_data(NodeLabelStep.kind)
        if label:
            had_label = not label.get("changed") and label.get("previous") == change.profile
        else:
            had_label = ctx.facts.labels.get(DEVICE_PLUGIN_CONFIG_LABEL) == change.profile
        if not had_label:
            return StepResult.noop("the device plugin takes the profile from the label change")
        published = ctx.load_data(ConfigMapUpdateStep.kind)
        if published:
            content_changed = bool(published.get("content_changed"))
        else:
            content_changed = changed_in_run(get_configmap(ctx, change), ctx.run_id, change.profile)
        if not content_changed:
            return StepResult.noop(
                f"already labelled {change.profile} and the profile is unchanged"
            )
        deleted_uid = ctx.load_data(self.kind).get("deleted_uid")
        if deleted_uid is None:  # no live pod: the DaemonSet's next one loads the profile
            old = live_device_plugin(ctx)
            deleted_uid, name = (old.uid, f"{old.namespace}/{old.name}") if old else ("", "")
            ctx.save_data(self.kind, {"deleted_pod": name, "deleted_uid": deleted_uid})
            if old is not None:
                ctx.kube.delete_pod(old.namespace, old.name, missing_ok=True)
        pod = wait_for_device_plugin(ctx, self.kind, str(deleted_uid))
        return StepResult.done(
            f"restarted the device plugin to reload profile {change.profile}: "
            f"pod {pod.namespace}/{pod.name} ready"
        )

    def undo(self, ctx: StepContext) -> None:
        """A restart cannot be undone; configmap.update's undo restarts it if needed."""
