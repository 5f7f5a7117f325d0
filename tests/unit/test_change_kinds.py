"""The change kinds' registry and the planning context.

A kind known only to a test's own table is read, planned and shown with no edit of the
planner or the plan model; an unknown key's error lists the registered keys; two plans made
one after the other in one process share nothing; and no module-level memo is left.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest
from pydantic import ValidationError

import rollout
from rollout.changes import KINDS, Kind, change_models, kind_planners
from rollout.changes.base import (
    ChangeKindPlanner,
    ClusterWork,
    NodeWork,
    PlanningContext,
)
from rollout.changes.model import ChangeModel
from rollout.changes.timeslicing.model import TimeSlicingChange
from rollout.errors import InputErrors
from rollout.facts import FleetFacts, NodeFacts, load_recorded_facts
from rollout.facts.live import gather_cluster_facts
from rollout.plan import Advertised, ClusterChange, LabelChange, Plan
from rollout.planner import build_plan
from rollout.playbook import Phase, Playbook, PlaybookStep, load_playbooks
from rollout.spec import Spec, parse_spec
from rollout.spec.changeentry import build_change_entry
from rollout.transports.kube import ConfigMap, KubeClient
from tests.examples import FACTS, PLAN
from tests.planning import sharing_config, time_slicing_plan

PACKAGE = Path(rollout.__file__).resolve().parent
ECHO_LABEL = "example.com/echo"


class EchoChange(ChangeModel):
    """A test-only change: label each node `example.com/echo=<value>`."""

    value: str

    def advertises(self, now: Mapping[str, int], physical: int) -> Advertised:
        return Advertised(now)


class EchoKind(ChangeKindPlanner):
    key: ClassVar[str] = "echo"
    model: ClassVar[type] = EchoChange

    def __init__(self) -> None:
        self.planned: list[str] = []

    def playbook(self, change: Any) -> str:
        return "echo"

    def step_modules(self) -> tuple[Any, ...]:
        return ()

    def plan_cluster(self, ctx: PlanningContext, change: Any) -> ClusterWork:
        return ClusterWork(
            changes=(ClusterChange("echo", "configmap/echo", f"write {change.value}"),),
            warnings=("echo shares nothing",),
        )

    def plan_node(self, ctx: PlanningContext, change: Any, node: NodeFacts) -> NodeWork:
        self.planned.append(node.name)
        return NodeWork(
            touches_node=True,
            labels=(LabelChange(ECHO_LABEL, node.labels.get(ECHO_LABEL), change.value),),
            notes=(f"echo on {node.name}",),
        )


ECHO_BOOK = Playbook(
    kind="echo",
    description="label the node",
    steps=(PlaybookStep("preflight", Phase.PREPARE, "the node is Ready"),),
    source="test",
)


def echo_spec() -> Spec:
    """The example plan with its changes replaced by one `echo:` change, read through a
    change entry built from a table that knows the echo kind."""
    entry = build_change_entry({**change_models(), "echo": EchoChange})
    spec = parse_spec(PLAN.read_text(), str(PLAN))
    echoed = entry.model_validate({"echo": {"value": "on"}})
    return spec.model_copy(update={"change_entries": (echoed,)})


def test_a_kind_in_a_test_table_is_planned_with_no_planner_edit() -> None:
    fleet = load_recorded_facts(FACTS)
    kind = EchoKind()
    plan = build_plan(
        echo_spec(),
        "plan.yaml",
        fleet,
        {**load_playbooks(), "echo": ECHO_BOOK},
        kinds={**kind_planners(), "echo": kind},
    )
    targets = [n.name for w in plan.waves for n in w.nodes]
    assert plan.changes == ("echo",)
    assert plan.cluster_changes == (ClusterChange("echo", "configmap/echo", "write on"),)
    assert plan.warnings == ("echo shares nothing",)
    assert sorted(kind.planned) == sorted(targets)  # each node planned once
    for node in (n for w in plan.waves for n in w.nodes):
        assert node.labels == (LabelChange(ECHO_LABEL, None, "on"),)
        assert f"echo on {node.name}" in node.warnings
        (step,) = node.steps
        assert (step.kind, step.changes) == ("preflight", True)


def test_a_change_entry_is_built_from_the_table() -> None:
    entry = build_change_entry({**change_models(), "echo": EchoChange})
    assert entry.model_validate({"echo": {"value": "x"}}).change == EchoChange(value="x")
    with pytest.raises(ValidationError) as two_keys:
        entry.model_validate({"echo": {"value": "x"}, "registry": {}})
    assert (
        "each change has exactly one key (registry, containerd, time-slicing, driver-upgrade, "
    ) in str(two_keys.value)
    assert "echo), found echo, registry" in str(two_keys.value)


def test_an_unknown_key_lists_the_registered_kinds() -> None:
    text = PLAN.read_text()
    start = text.index("changes:")
    with pytest.raises(InputErrors) as refused:
        parse_spec(text[:start] + "changes:\n  - gpus: {count: 1}\n", "plan.yaml")
    message = str(refused.value)
    assert "unknown key 'gpus'" in message
    assert f"known keys: {', '.join(sorted(KINDS))}" in message


def test_an_unknown_kind_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(KeyError) as unknown:
        kind_planners(["gpus"])
    assert f"the kinds are {', '.join(KINDS)}" in str(unknown.value)
    table = {"echo": Kind("changes.echo", "changes.echo.model:EchoChange")}
    with pytest.raises(KeyError, match="the kinds are echo"):
        kind_planners(["registry"], table)


# ------------------------------------------------------------------- the planning context


def time_slicing_fleet(profile_data: dict[str, str]) -> FleetFacts:
    fleet = load_recorded_facts(FACTS)
    policy = {"devicePlugin": {"config": {"name": "time-slicing-config", "default": "default"}}}
    cluster = dataclasses.replace(
        fleet.cluster,
        configmaps={"gpu-operator/time-slicing-config": profile_data},
        cluster_policy=policy,
    )
    return dataclasses.replace(fleet, cluster=cluster)


def plan_of(profile: str, replicas: int, fleet: FleetFacts) -> Plan:
    text = time_slicing_plan(
        name="shared",
        targets="{selector: nvidia.com/gpu.present=true}",
        profile=profile,
        replicas=replicas,
    )
    return build_plan(parse_spec(text, "plan.yaml"), "plan.yaml", fleet, load_playbooks())


def test_a_plan_made_after_another_is_the_plan_made_alone() -> None:
    """The old module memos' hazard: a value kept for one plan answered the next."""
    fleet_b = time_slicing_fleet({"default": sharing_config(2)})
    alone = plan_of("shared-8x", 8, fleet_b)
    fleet_a = time_slicing_fleet({"default": sharing_config(2), "shared-4x": sharing_config(4)})
    first = plan_of("shared-4x", 4, fleet_a)
    after = plan_of("shared-8x", 8, fleet_b)
    assert after == alone
    assert first != alone
    assert [c.target for c in after.cluster_changes] == [c.target for c in alone.cluster_changes]


class CountingKind(EchoKind):
    def plan_node(self, ctx: PlanningContext, change: Any, node: NodeFacts) -> NodeWork:
        if node.name == "broken":
            self.planned.append(node.name)
            raise ValueError("broken node")
        return super().plan_node(ctx, change, node)


def test_the_context_plans_a_nodes_work_once_and_keeps_no_error() -> None:
    fleet = load_recorded_facts(FACTS)
    kind = CountingKind()
    ctx = PlanningContext(echo_spec(), fleet, {**kind_planners(), "echo": kind})
    node = fleet.nodes[0]
    assert ctx.work(node, "echo") is ctx.work(node, "echo")
    # containerd's kind describes every node, first; then the plan's own kinds
    assert ctx.all_work(node) == (ctx.work(node, "containerd"), ctx.work(node, "echo"))
    assert kind.planned == [node.name]
    broken = dataclasses.replace(node, name="broken")
    for _ in range(2):
        with pytest.raises(ValueError, match="broken node"):
            ctx.work(broken, "echo")
    assert kind.planned == [node.name, "broken", "broken"]  # asked again, planned again
    # another context plans afresh
    PlanningContext(echo_spec(), fleet, {**kind_planners(), "echo": kind}).work(node, "echo")
    assert kind.planned[-1] == node.name and len(kind.planned) == 4


def node_shadowing(plan: Plan) -> dict[str, tuple[str, ...]]:
    return {n.name: n.shadowing for w in plan.waves for n in w.nodes if n.shadowing}


def test_every_plan_shows_the_shadowing_of_each_nodes_containerd_files() -> None:
    """containerd's kind describes every node: a driver plan shows what a registry plan
    shows of a node whose drop-in replaces the CRI table (and groups the node apart)."""
    fleet = load_recorded_facts(FACTS)
    registry = build_plan(parse_spec(PLAN.read_text(), str(PLAN)), "p", fleet, load_playbooks())
    driver_plan = PLAN.parent / "driver-host.yaml"
    spec = parse_spec(driver_plan.read_text(), str(driver_plan))
    driver = build_plan(spec, "p", fleet, load_playbooks())
    assert node_shadowing(registry)
    assert node_shadowing(driver) == node_shadowing(registry)


def test_a_kind_the_plan_lacks_works_nothing() -> None:
    fleet = load_recorded_facts(FACTS)
    ctx = PlanningContext(echo_spec(), fleet, {**kind_planners(), "echo": EchoKind()})
    assert ctx.work(fleet.nodes[0], "time-slicing") == NodeWork()


# ------------------------------------------------------------------------- the AST checks


def kind_names_in(source: str) -> list[str]:
    """What in a module names a change kind: an import of a kind's own module (anything of
    rollout.changes or rollout.steps but their bases), a kind's model, a key or a playbook."""
    models = {model.__name__ for model in change_models().values()}
    keys = set(KINDS) | set(load_playbooks())
    shared = {"rollout.changes", "rollout.changes.base", "rollout.steps", "rollout.steps.base"}
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom | ast.Import):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            modules += [a.name for a in node.names if isinstance(node, ast.Import)]
            found += [
                m
                for m in modules
                if m.startswith(("rollout.changes.", "rollout.steps.")) and m not in shared
            ]
            found += [a.name for a in node.names if a.name in models]
        elif isinstance(node, ast.Name) and node.id in models:
            found.append(node.id)
        elif isinstance(node, ast.Constant) and node.value in keys:
            found.append(str(node.value))
    return found


def test_the_planner_names_no_change_kind() -> None:
    assert kind_names_in((PACKAGE / "planner.py").read_text()) == []


def test_the_kind_check_sees_a_kind_named() -> None:
    source = (
        "from rollout.changes.timeslicing.profiles import plan_cluster_changes\n"
        "from rollout.steps.base import StepPlanner\n"
        "if isinstance(change, TimeSlicingChange):\n    kinds.append('driver-upgrade')\n"
    )
    assert kind_names_in(source) == [
        "rollout.changes.timeslicing.profiles",
        "TimeSlicingChange",
        "driver-upgrade",
    ]


MEMO_CLASSES = {"IdentityMemo", "BoundedCache", "ValueTable", "DiskMemo", "ContainerdPlans"}
# planning: the planner, the steps and the change kinds keep state in a PlanningContext
PLANNING = ("planner.py", "steps/", "changes/")


def module_memos(source: str, planning: bool) -> list[str]:
    """Module-level memo objects: an IdentityMemo anywhere; in planning modules, any memo."""
    found: list[str] = []
    for node in ast.parse(source).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if not isinstance(value, ast.Call):
            continue
        name = getattr(value.func, "id", None) or getattr(value.func, "attr", None)
        if name == "IdentityMemo" or (planning and name in MEMO_CLASSES):
            found.append(f"line {node.lineno}: {name}")
    return found


def test_no_module_level_memo_is_left() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "memo.py":
            continue
        planning = relative.startswith(PLANNING)
        if memos := module_memos(path.read_text(), planning):
            found[relative] = memos
    assert found == {}


def test_the_memo_check_sees_a_module_memo() -> None:
    source = (
        "_memo: IdentityMemo[int] = IdentityMemo(8)\n"
        "PLANS = ContainerdPlans()\n"
        "def f():\n    local = IdentityMemo(2)\n"
    )
    assert module_memos(source, planning=True) == [
        "line 1: IdentityMemo",
        "line 2: ContainerdPlans",
    ]
    assert module_memos(source, planning=False) == ["line 1: IdentityMemo"]


# ------------------------------------------------------------- the cluster reads of the kinds


class ConfigMapKube:
    """The cluster reads of gather_cluster_facts: the ConfigMaps it asks for, in order."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def list_cluster_policies(self) -> list[dict[str, Any]]:
        return [{"spec": {"devicePlugin": {"config": {"name": "time-slicing-config"}}}}]

    def list_pdbs(self, namespace: str | None) -> list[Any]:
        return []

    def get_configmap(self, namespace: str, name: str) -> Any:
        self.asked.append((namespace, name))
        return ConfigMap(namespace=namespace, name=name, data={"default": "version: v1\n"})


def test_live_cluster_facts_read_the_configmaps_the_kinds_name() -> None:
    text = time_slicing_plan(name="s", targets="{selector: a=b}", profile="shared-4x")
    spec = parse_spec(text, "plan.yaml")
    (change,) = spec.changes_of(TimeSlicingChange)
    kube = ConfigMapKube()
    cluster = gather_cluster_facts(spec, cast(KubeClient, kube))
    where = (change.configmap.namespace, change.configmap.name)
    assert kube.asked == [where]
    assert dict(cluster.configmaps) == {"/".join(where): {"default": "version: v1\n"}}
    # a plan whose kinds read no ConfigMap asks for none
    kube = ConfigMapKube()
    gather_cluster_facts(parse_spec(PLAN.read_text(), str(PLAN)), cast(KubeClient, kube))
    assert kube.asked == []
