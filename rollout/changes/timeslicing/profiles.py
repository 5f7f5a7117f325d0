"""What a time-slicing change does to the cluster and to one node, decided once.

The cluster side (`plan_publication`): the profile's key in the ConfigMap, the ClusterPolicy
pointing at it, and what nodes *without* the profile label run meanwhile. The device
plugin's config-manager gives an unlabelled node ClusterPolicy `config.default`, else a key
named `default`, else the only key of the ConfigMap (FACTS.md). Publishing a profile as the
only key would so share every GPU node at once, before its wave; the publication therefore
keeps unlabelled nodes on what they run today — the profile they fall back to now, or no
sharing — through a `default` key or `config.default`, and nodes change one by one, when
their wave labels them.

The node side (`plan_profile`): the node's profile label, or — when the node already carries
the label and only the profile's content changes — a device-plugin restart, because the
config-manager reacts to label changes only. A node labelled with a profile the ConfigMap
will not hold is refused: its config-manager would exit and its device plugin stay down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from rollout.changes.base import NodeWork, PlanningContext
from rollout.changes.timeslicing.model import TimeSlicingChange
from rollout.deviceprofiles import (
    DEFAULT_KEY,
    DEVICE_PLUGIN_CONFIG_LABEL,
    fallback_key,
    load_profile,
)
from rollout.errors import InputError
from rollout.facts import ClusterFacts, NodeFacts
from rollout.facts.gpu_operator import DevicePluginConfigRef
from rollout.operatorrolls import describe_rolls
from rollout.plan import ClusterChange, FileChange, LabelChange
from rollout.spec import Spec

# Where the fallback goes when the key `default` is taken by something else.
SPARE_FALLBACK_KEY = "rollout-fallback"
# A device-plugin config that shares nothing: what a node without any config runs.
NO_SHARING_CONFIG = "version: v1\n"
SHARED_MEMORY_WARNING = (
    "time-slicing shares each GPU, it does not divide it: every replica can use all of the "
    "GPU's memory and a fault in one workload can affect the others"
)


def render_profile(change: TimeSlicingChange) -> str:
    """The profile as stored under its key: the device plugin's YAML (as the plan shows it)."""
    return yaml.safe_dump(change.config_document(), sort_keys=False)


def profile_meaning(text: str | None) -> Any:
    """What a config does, for comparing two: its document without `version`; no config and
    a config that shares nothing mean the same."""
    if text is None:
        return {}
    document = load_profile(text)
    if not isinstance(document, Mapping):
        return text
    meaning = {k: v for k, v in document.items() if k != "version"}
    if not meaning.get("sharing"):
        meaning.pop("sharing", None)
    return meaning


def describe_profile(key: str | None, text: str | None) -> str:
    if profile_meaning(text) == {}:
        return "no sharing"
    return f"profile {key!r}"


@dataclass(frozen=True)
class Publication:
    """The cluster-wide half of a time-slicing change: ConfigMap keys and ClusterPolicy fields.

    `writes` are the keys to set (the profile, and a fallback key when unlabelled nodes need
    one); `policy` the `spec.devicePlugin.config` fields to set. Empty both: nothing to do.
    """

    configmap: str
    key: str
    before: Mapping[str, str]
    writes: Mapping[str, str]
    policy: Mapping[str, str]
    policy_before: Mapping[str, str]
    unlabelled: str
    # how unlabelled nodes reach what they keep: "key 'default'", "config.default = 'x'", ...
    unlabelled_via: str
    fallback_added: str | None = None
    keys_after: frozenset[str] = field(default_factory=frozenset)

    @property
    def pending(self) -> bool:
        return bool(self.writes or self.policy)

    def to_cluster_changes(self) -> list[ClusterChange]:
        """The publication as the plan shows it: ConfigMap, ClusterPolicy, unlabelled nodes."""
        changes: list[ClusterChange] = []
        if self.writes:
            parts: list[str] = []
            diffs: list[str] = []
            for key, text in self.writes.items():
                before = self.before.get(key)
                verb = "update" if before is not None else "add"
                what = f"{verb} key {key!r}"
                if key == self.fallback_added:
                    what += f" ({self.unlabelled}, for nodes without the label)"
                parts.append(what)
                diffs.append(
                    FileChange(f"/{self.configmap}/{key}", before, text, "").unified_diff()
                )
            others = sorted(k for k in self.before if k not in self.writes)
            if others:
                parts.append(f"other profiles kept: {', '.join(others)}")
            changes.append(
                ClusterChange("configmap", self.configmap, "; ".join(parts), "".join(diffs))
            )
        else:
            changes.append(
                ClusterChange(
                    "configmap",
                    self.configmap,
                    None,
                    noop_reason=f"key {self.key!r} already holds this profile",
                )
            )
        if self.policy:
            changes.append(
                ClusterChange(
                    "clusterpolicy",
                    "cluster-policy",
                    "; ".join(
                        [
                            f"set spec.devicePlugin.config.{name} = {value!r} "
                            f"(now {self.policy_before.get(name) or 'unset'!r})"
                            for name, value in self.policy.items()
                        ]
                        + [describe_rolls(f"devicePlugin.config.{n}" for n in self.policy)]
                    ),
                )
            )
        changes.append(
            ClusterChange(
                "unlabelled-nodes",
                f"nodes without {DEVICE_PLUGIN_CONFIG_LABEL}",
                None,
                noop_reason=(
                    f"keep {self.unlabelled} ({self.unlabelled_via}); a node takes profile "
                    f"{self.key!r} only when its own wave labels it"
                ),
            )
        )
        return changes


def refuse(spec: Spec, change: TimeSlicingChange, message: str, hint: str) -> InputError:
    """A time-slicing change rollout will not make, located at the change in the plan file."""
    index = next(i for i, c in enumerate(spec.changes) if c is change)
    return InputError(spec.location_of("changes", index, "time-slicing"), message, hint=hint)


def planned_publication(ctx: PlanningContext) -> Publication | None:
    """The plan's publication, decided once per plan: every node's plan reads it, and so does
    the plan's cluster part."""
    return ctx.memo(("time-slicing publication",), lambda: plan_publication(ctx.spec, ctx.cluster))


def plan_publication(spec: Spec, cluster: ClusterFacts) -> Publication | None:
    """What the ConfigMap and the ClusterPolicy must hold so only labelled nodes change."""
    change = spec.change_of(TimeSlicingChange)
    if change is None:
        return None
    ref = f"{change.configmap.namespace}/{change.configmap.name}"
    data = dict(cluster.configmaps.get(ref, {}))
    current = DevicePluginConfigRef.from_policy(cluster.cluster_policy)
    name, default = current.name, current.default
    if name and name != change.configmap.name:
        raise refuse(
            spec,
            change,
            f"the ClusterPolicy points the device plugin at configmap {name!r}, this change at "
            f"{change.configmap.name!r}: switching would change every GPU node's profile at once",
            f"put the profile in {name!r} (configmap.name: {name})",
        )
    # What a node without the label runs today.
    now_key = fallback_key(default, data) if name else None
    if now_key is not None and now_key not in data:
        raise refuse(
            spec,
            change,
            f"the ClusterPolicy's config.default is {now_key!r}, a key configmap {ref} does "
            "not hold: the device plugin of every unlabelled node fails to start",
            "fix spec.devicePlugin.config.default in the ClusterPolicy first",
        )
    now_text = data.get(now_key) if now_key is not None else None
    wanted = render_profile(change)
    before_text = data.get(change.profile)
    writes: dict[str, str] = {}
    if before_text is None or load_profile(before_text) != change.config_document():
        writes[change.profile] = wanted
    after = {**data, **writes}
    policy: dict[str, str] = {} if name else {"name": change.configmap.name}
    added: str | None = None
    then_key = fallback_key(default, after)
    then_text = after.get(then_key) if then_key is not None else None
    kept = (then_key is None or then_key in after) and profile_meaning(
        then_text
    ) == profile_meaning(now_text)
    if not kept:
        holders = sorted(
            (
                k
                for k in after
                if k != change.profile and profile_meaning(after[k]) == profile_meaning(now_text)
            ),
            key=lambda k: k != DEFAULT_KEY,
        )
        if holders:
            then_key = holders[0]
        else:
            then_key = next((k for k in (DEFAULT_KEY, SPARE_FALLBACK_KEY) if k not in after), None)
            if then_key is None:
                raise refuse(
                    spec,
                    change,
                    f"nodes without the label would change profile: configmap {ref} has no "
                    f"free key ({DEFAULT_KEY!r}, {SPARE_FALLBACK_KEY!r}) to keep their "
                    f"{describe_profile(now_key, now_text)} in",
                    "set the ClusterPolicy's spec.devicePlugin.config.default to a key "
                    "holding what unlabelled nodes run today",
                )
            writes[then_key] = now_text if now_text is not None else NO_SHARING_CONFIG
            after[then_key] = writes[then_key]
            added = then_key
        if fallback_key(default, after) != then_key:
            policy["default"] = then_key
    if then_key is None:
        via = "no config: the ConfigMap has no `default` key and several keys"
    elif policy.get("default") or default:
        via = f"config.default = {then_key!r}"
    else:
        via = f"key {then_key!r}"
    return Publication(
        configmap=ref,
        key=change.profile,
        before=data,
        writes=writes,
        policy=policy,
        policy_before={"name": name, "default": default},
        unlabelled=describe_profile(now_key, now_text),
        unlabelled_via=via,
        fallback_added=added,
        keys_after=frozenset(after),
    )


def plan_cluster_changes(ctx: PlanningContext) -> list[ClusterChange]:
    """ConfigMap and ClusterPolicy changes for time-slicing, made once before wave 1."""
    publication = planned_publication(ctx)
    return publication.to_cluster_changes() if publication is not None else []


@dataclass(frozen=True)
class ProfileChange:
    """What time-slicing changes on one node: its profile label, or a device-plugin restart."""

    label: LabelChange | None = None
    restart_device_plugin: bool = False
    noop_reason: str | None = None

    @property
    def changes_node(self) -> bool:
        return self.label is not None or self.restart_device_plugin


def plan_profile(ctx: PlanningContext, node: NodeFacts) -> ProfileChange:
    """The node's profile label change, or the device-plugin restart a new profile needs."""
    spec = ctx.spec
    change = spec.change_of(TimeSlicingChange)
    publication = planned_publication(ctx)
    if change is None or publication is None:
        return ProfileChange(noop_reason="no time-slicing change")
    current = node.labels.get(DEVICE_PLUGIN_CONFIG_LABEL)
    if current and current not in publication.keys_after:
        raise refuse(
            spec,
            change,
            f"node {node.name} is labelled {DEVICE_PLUGIN_CONFIG_LABEL}={current}, a profile "
            f"configmap {publication.configmap} does not hold: its device plugin's "
            "config-manager exits on such a label, and the GPUs of the node go unadvertised",
            f"remove the label (kubectl label node {node.name} {DEVICE_PLUGIN_CONFIG_LABEL}-) "
            f"or add profile {current!r} to the ConfigMap, then plan again",
        )
    if current != change.profile:
        return ProfileChange(label=LabelChange(DEVICE_PLUGIN_CONFIG_LABEL, current, change.profile))
    if change.profile in publication.writes:
        # The config-manager watches labels, not ConfigMaps: a new profile under the same
        # label needs a device-plugin restart.
        return ProfileChange(
            restart_device_plugin=True, noop_reason=f"already labelled {change.profile}"
        )
    return ProfileChange(
        noop_reason=f"already labelled {change.profile} and the profile is unchanged"
    )


NO_PROFILE_CHANGE = ProfileChange(noop_reason="no time-slicing change")


@dataclass(frozen=True)
class ProfileWork(NodeWork):
    """The time-slicing change's work on one node: its profile label or device-plugin restart."""

    profile: ProfileChange = NO_PROFILE_CHANGE

    @classmethod
    def from_node(cls, ctx: PlanningContext, node: NodeFacts) -> ProfileWork:
        profile = plan_profile(ctx, node)
        return cls(
            touches_node=profile.changes_node,
            cluster_pending=any(c.action is not None for c in plan_cluster_changes(ctx)),
            labels=(profile.label,) if profile.label is not None else (),
            profile=profile,
        )
