"""What is true of a step kind, declared on its class (`traits`), so that no table of step
names elsewhere can miss a new step: whether it changes a cluster-wide object, whether it
takes its node down, the API permissions it needs, whether it reaches the node over SSH, and
how long it takes.

The executor, the saved-plan gate, the schedule's Role, its manifests and the duration
forecast read these through the step registry (rollout.steps.step_traits).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollout.rbac import Grant

if TYPE_CHECKING:
    from rollout.plan import NodePlan
    from rollout.spec import Policy

# A step without a timeout of its own in the policy: the request timeouts and retries bound it.
REQUEST_BOUND_S = 60.0


def bounded_by_requests(policy: Policy) -> float:
    """The worst duration of a step the policy sets no timeout for."""
    return REQUEST_BOUND_S


def fixed_s(seconds: float) -> Callable[[Policy], float]:
    """A worst duration that no policy field changes."""
    return lambda policy: seconds


@dataclass(frozen=True)
class StepTraits:
    """What a step kind is, whatever node it runs on. Every field is required: a new step
    class says each of them (tests/unit/test_step_traits.py checks every registered one)."""

    # changes an object shared by every node (a ConfigMap, the ClusterPolicy): the executor
    # runs it one node at a time, and nodes going NotReady after it are waited for
    cluster_wide: bool
    # makes its node unavailable when it acts (a cordon): the node needs a budget slot
    takes_down: bool
    # reaches the node over SSH: a scheduled run needs the inventory and the SSH Secret
    uses_ssh: bool
    # what it asks of the API beyond every run's own requests (rollout.schedule.permissions)
    grants: tuple[Grant, ...]
    # its typical time on a healthy node: mandatory waits plus round trips
    expected_s: float
    # the longest it may take before it fails, under the plan's policy (its timeout)
    worst_s: Callable[[Policy], float]


def takes_down(node: NodePlan, traits: Mapping[str, StepTraits]) -> bool:
    """Whether one of the node's acting steps makes it unavailable: it needs a budget slot."""
    return any(step.changes and traits[step.kind].takes_down for step in node.steps)


def cluster_wide_kinds(traits: Mapping[str, StepTraits]) -> frozenset[str]:
    """The kinds that change an object shared by every node (a ConfigMap, the ClusterPolicy)."""
    return frozenset(kind for kind, declared in traits.items() if declared.cluster_wide)
