"""The step seam: what every step kind implements, and what it is given to do it.

A step is idempotent: `apply` first reads fresh state (the drift check) and returns a no-op
result when its effect is already there, so `rollout resume` can call it again for a step
that was in flight when a run was killed. `undo` puts back what `apply` changed and is
idempotent too. Verification is part of `apply`: a step that cannot prove its effect fails.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rollout.budget import RunBudget
from rollout.commands import CommandRunner
from rollout.errors import RolloutError, TransientError
from rollout.facts import NodeFacts
from rollout.plan import NodePlan, StepPlan
from rollout.run import Journal
from rollout.spec import Spec
from rollout.steps.deadline import Deadline, HaltLabelSeen, HaltWatch
from rollout.steps.traits import StepTraits

if TYPE_CHECKING:
    # typing only: `rollout plan --facts` plans with the steps and never talks to a cluster,
    # so it must not pay for importing the kubernetes client
    from rollout.changes.base import PlanningContext
    from rollout.transports.kube import KubeClient


class StepResultKind(enum.Enum):
    DONE = "done"
    NOOP = "noop"


@dataclass(frozen=True)
class StepResult:
    """What a step did (or why it had nothing to do), in one line for the journal."""

    kind: StepResultKind
    detail: str

    @classmethod
    def done(cls, detail: str) -> StepResult:
        return cls(StepResultKind.DONE, detail)

    @classmethod
    def noop(cls, detail: str) -> StepResult:
        return cls(StepResultKind.NOOP, detail)


class StepFailed(RolloutError):
    """A step could not do or prove its effect; names the node, the step and what to check."""

    def __init__(self, node: str, step: str, message: str) -> None:
        self.node = node
        self.step = step
        super().__init__(f"{node}: {step}: {message}")


@contextmanager
def translate_step_errors(node: str, step: str, *, undo: bool = False) -> Iterator[None]:
    """A node error in the block fails the step (prefixed `undo: ` for an undo); a StepFailed
    passes as it is and a transient error goes on to the retry policy, which decides."""
    try:
        yield
    except (StepFailed, TransientError, HaltLabelSeen):
        raise
    except RolloutError as exc:
        raise StepFailed(node, step, f"undo: {exc}" if undo else str(exc)) from exc


@dataclass
class StepContext:
    """Everything a step may use for one node of one run."""

    node: str
    node_plan: NodePlan
    facts: NodeFacts
    spec: Spec
    runner: CommandRunner
    kube: KubeClient
    journal: Journal
    progress: Callable[[str], None] = print
    sleep: Callable[[float], None] = time.sleep
    # set by the executor while a step applies (not while it is undone): waits end on a halt
    halt_watch: HaltWatch | None = None
    # set by the executor: the run's one unavailability budget, which a step that hands its
    # node to another controller's upgrade takes the node's slot from (driver.release)
    budget: RunBudget | None = None

    @property
    def run_id(self) -> str:
        return str(self.journal.run_id)

    def deadline(self, limit_s: float, *, judges_own_node: bool = False) -> Deadline:
        """A wait's time limit; its polls end at once when a halt label appears on a node
        (the node in flight aside when `judges_own_node`: the step itself watches its label)."""
        except_node = self.node if judges_own_node else ""
        return Deadline(limit_s, self.sleep, self.halt_watch, except_node)

    def save_data(self, step: str, data: Mapping[str, Any]) -> None:
        """Keep what later steps (or a resumed run) need from this step, durably."""
        self.journal.save_step_data(self.node, step, data)

    def load_data(self, step: str) -> dict[str, Any]:
        """What an earlier step of this node saved; {} when it saved nothing."""
        return self.journal.load_step_data(self.node, step)


class StepPlanner(Protocol):
    """A step kind's one decision — its action, or why it has nothing to do — from facts alone.

    `rollout plan` shows it; `rollout apply` runs only steps whose plan acts, and a step's
    `apply` that re-checks fresh state asks the same `plan` again.
    """

    kind: ClassVar[str]

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan: ...


class Step(StepPlanner, Protocol):
    """A step kind rollout can run: `plan`, `apply` (idempotent, verified), `undo` (idempotent),
    and what is true of it whatever the node (`traits`, read through the step registry)."""

    traits: ClassVar[StepTraits]

    def apply(self, ctx: StepContext) -> StepResult: ...

    def undo(self, ctx: StepContext) -> None: ...
