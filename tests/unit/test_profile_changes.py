"""Publishing a time-slicing profile so that only labelled nodes change (safety invariant 8).

Cases as data: the ConfigMap and the ClusterPolicy before, what rollout writes, and what a
node without the profile label runs after. The last is computed twice: by rollout's own
model of the config-manager's fallback and by the lab's simulation of it, which must agree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from rollout.changes.base import PlanningContext
from rollout.changes.timeslicing.profiles import (
    NO_SHARING_CONFIG,
    ProfileChange,
    ProfileWork,
    Publication,
    plan_publication,
)
from rollout.cli import main
from rollout.errors import InputError
from rollout.facts import ClusterFacts, FleetFacts, NodeFacts
from rollout.lab.simulation.profiles import ProfileError, parse_profile, select_profile
from rollout.spec import Spec, parse_spec
from tests.examples import FACTS
from tests.node_facts import containerd_node
from tests.planning import sharing_config, time_slicing_plan

REF = "gpu-operator/time-slicing-config"
LABEL = "nvidia.com/device-plugin.config"


def plan_text(profile: str) -> str:
    return time_slicing_plan(name="share", targets="{nodes: [gpu-a-1, gpu-a-2]}", profile=profile)


def make_spec(profile: str = "shared-4x") -> Spec:
    return parse_spec(plan_text(profile), "plan.yaml")


def make_cluster(data: Mapping[str, str] | None, name: str = "", default: str = "") -> ClusterFacts:
    return ClusterFacts(
        configmaps={REF: dict(data)} if data is not None else {},
        cluster_policy={"devicePlugin": {"config": {"name": name, "default": default}}},
    )


def applied(publication: Publication, cluster: ClusterFacts) -> ClusterFacts:
    """The cluster after configmap.update made the publication."""
    data = {**cluster.configmaps.get(REF, {}), **publication.writes}
    config = {**cluster.cluster_policy["devicePlugin"]["config"], **publication.policy}
    return ClusterFacts(configmaps={REF: data}, cluster_policy={"devicePlugin": {"config": config}})


def lab_replicas(cluster: ClusterFacts, labels: Mapping[str, str]) -> int:
    """What the lab's device plugin advertises per GPU for a node with these labels."""
    config = cluster.cluster_policy["devicePlugin"]["config"]
    configmap = {"data": cluster.configmaps[REF]} if REF in cluster.configmaps else None
    return select_profile(
        {"spec": {"devicePlugin": {"config": config}}}, configmap, labels
    ).replicas


@dataclass(frozen=True)
class Case:
    id: str
    data: Mapping[str, str] | None
    name: str = ""
    default: str = ""
    profile: str = "shared-4x"
    writes: Mapping[str, str] = field(default_factory=dict)
    policy: Mapping[str, str] = field(default_factory=dict)
    unlabelled: str = "keep no sharing (key 'default')"


CASES = [
    Case(
        "no ConfigMap yet: the profile would be the only key, so a `default` shares nothing",
        None,
        writes={"shared-4x": sharing_config(4), "default": NO_SHARING_CONFIG},
        policy={"name": "time-slicing-config"},
    ),
    Case(
        "ClusterPolicy unset over a single-key ConfigMap: two keys leave no fallback at all",
        {"old-2x": sharing_config(2)},
        writes={"shared-4x": sharing_config(4)},
        policy={"name": "time-slicing-config"},
        unlabelled="keep no sharing (no config",
    ),
    Case(
        "the only key is in effect for unlabelled nodes: config.default keeps it",
        {"old-2x": sharing_config(2)},
        name="time-slicing-config",
        writes={"shared-4x": sharing_config(4)},
        policy={"default": "old-2x"},
        unlabelled="keep profile 'old-2x' (config.default = 'old-2x')",
    ),
    Case(
        "new content under the key unlabelled nodes fall back to: the old content moves aside",
        {"shared-4x": sharing_config(2)},
        name="time-slicing-config",
        writes={"shared-4x": sharing_config(4), "default": sharing_config(2)},
        unlabelled="keep profile 'shared-4x' (key 'default')",
    ),
    Case(
        "config.default elsewhere already: only the profile is written",
        {"base": NO_SHARING_CONFIG, "x": sharing_config(8)},
        name="time-slicing-config",
        default="base",
        writes={"shared-4x": sharing_config(4)},
        unlabelled="keep no sharing (config.default = 'base')",
    ),
    Case(
        "a `default` key already holds what unlabelled nodes run",
        {"default": sharing_config(2), "x": sharing_config(8)},
        name="time-slicing-config",
        writes={"shared-4x": sharing_config(4)},
        unlabelled="keep profile 'default' (key 'default')",
    ),
    Case(
        "the profile is named `default`: the fallback goes to a spare key",
        {"a": sharing_config(2), "b": sharing_config(8)},
        name="time-slicing-config",
        profile="default",
        writes={"default": sharing_config(4), "rollout-fallback": NO_SHARING_CONFIG},
        policy={"default": "rollout-fallback"},
        unlabelled="keep no sharing (config.default = 'rollout-fallback')",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_unlabelled_nodes_keep_what_they_run(case: Case) -> None:
    spec = make_spec(case.profile)
    cluster = make_cluster(case.data, case.name, case.default)
    publication = plan_publication(spec, cluster)
    assert publication is not None
    assert {k: parse_profile(v).replicas for k, v in publication.writes.items()} == {
        k: parse_profile(v).replicas for k, v in case.writes.items()
    }
    assert dict(publication.policy) == dict(case.policy)
    (shown,) = [c for c in publication.to_cluster_changes() if c.kind == "unlabelled-nodes"]
    assert shown.noop_reason is not None and shown.noop_reason.startswith(case.unlabelled)
    # the lab's config-manager agrees: unlabelled nodes advertise what they did, labelled
    # nodes the new profile; and planning again finds nothing left to do
    after = applied(publication, cluster)
    before_replicas = lab_replicas(cluster, {}) if case.name else 1
    assert lab_replicas(after, {}) == before_replicas
    assert lab_replicas(after, {LABEL: case.profile}) == 4
    again = plan_publication(spec, after)
    assert again is not None and not again.pending


def test_the_old_single_key_publication_would_share_every_node() -> None:
    """The bug this guards against, in the lab's terms: the profile as the only key."""
    only = make_cluster({"shared-4x": sharing_config(4)}, name="time-slicing-config")
    assert lab_replicas(only, {}) == 4


def test_a_policy_pointing_at_another_configmap_is_refused() -> None:
    cluster = make_cluster({"x": sharing_config(2)}, name="their-config")
    with pytest.raises(InputError) as refused:
        plan_publication(make_spec(), cluster)
    assert "'their-config'" in str(refused.value) and "plan.yaml:7" in str(refused.value)


def profile_of(facts: NodeFacts, cluster: ClusterFacts, spec: Spec) -> ProfileChange:
    """The node's time-slicing change, as one plan's context decides it."""
    ctx = PlanningContext(spec, FleetFacts((facts,), cluster, "test"))
    return ctx.work_as(facts, "time-slicing", ProfileWork, ProfileWork()).profile


def node(labels: Mapping[str, str]) -> NodeFacts:
    return replace(containerd_node("gpu-a-2"), labels=dict(labels))


def test_a_node_labelled_with_a_profile_the_configmap_lacks_is_refused() -> None:
    cluster = make_cluster(
        {"a": sharing_config(2), "b": sharing_config(8)}, name="time-slicing-config"
    )
    with pytest.raises(InputError) as refused:
        profile_of(node({LABEL: "a100-typo"}), cluster, make_spec())
    message = str(refused.value)
    assert message.startswith("plan.yaml:7:")  # the time-slicing change
    assert "node gpu-a-2" in message and f"{LABEL}=a100-typo" in message
    assert "config-manager exits" in message
    # labels naming a key the ConfigMap holds (or will hold) are fine
    assert profile_of(node({LABEL: "b"}), cluster, make_spec()).label is not None
    assert profile_of(node({LABEL: "shared-4x"}), cluster, make_spec()).label is None


def test_the_lab_config_manager_exits_on_a_label_naming_no_key() -> None:
    cluster = make_cluster({"a": sharing_config(2)}, name="time-slicing-config")
    with pytest.raises(ProfileError, match="a100-typo"):
        lab_replicas(cluster, {LABEL: "a100-typo"})
    with pytest.raises(ProfileError, match="'gone'"):
        lab_replicas(make_cluster({"a": sharing_config(2)}, "time-slicing-config", "gone"), {})


def test_rollout_plan_says_what_unlabelled_nodes_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(plan_text("a100-4x"))
    assert main(["plan", str(plan), "--facts", str(FACTS), "--output", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    changes = {c["kind"]: c for c in data["cluster_changes"]}
    assert (
        "add key 'default' (no sharing, for nodes without the label)"
        in (changes["configmap"]["action"])
    )
    assert changes["unlabelled-nodes"]["noop_reason"].startswith(
        "keep no sharing (key 'default'); a node takes profile 'a100-4x' only when its own "
        "wave labels it"
    )
    assert main(["plan", str(plan), "--facts", str(FACTS)]) == 0
    text = capsys.readouterr().out
    assert "= unlabelled-nodes nodes without nvidia.com/device-plugin.config: keep no sharing" in (
        text
    )
