"""`mig:` the MIG layout the GPU Operator's MIG manager gives the targeted nodes' GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar

from pydantic import AfterValidator

from rollout.changes.model import ChangeModel
from rollout.inputs.fieldproblems import FieldProblem
from rollout.inputs.fieldtypes import Str, check_label_value
from rollout.plan import Advertised

# what the forecast says where it cannot read the layout (a model alone, without the cluster)
UNREAD_CAVEAT = (
    "MIG: the layout's devices are read from the MIG manager's ConfigMap when the plan is "
    "made; without it the forecast keeps the node's GPU resources as they are"
)


def check_layout_name(value: str) -> str:
    """A layout name is the value of the node label nvidia.com/mig.config."""
    problem = check_label_value(value)
    if problem or not value:
        raise FieldProblem(
            "the layout is the value of the node label nvidia.com/mig.config: "
            f"{problem or 'it must not be empty'}",
            hint="name one of the layouts (mig-configs) of the MIG manager's ConfigMap",
        )
    return value


class MigChange(ChangeModel):
    """Label each node `nvidia.com/mig.config=<config>` and wait for the MIG manager."""

    key: ClassVar[str] = "mig"

    config: Annotated[Str, AfterValidator(check_layout_name)]

    def advertises(self, now: Mapping[str, int], physical: int) -> Advertised:
        """Without the cluster's layout and strategy: the node's resources as they are, and
        why (the planner forecasts the layout itself, rollout.changes.mig.kind)."""
        return Advertised(dict(now), (UNREAD_CAVEAT,))
