"""policy.verify.gates: the health gates a node passes before it is returned to service.

Each gate but DCGM is on by default and acts only where the cluster has what it reads
(docs/gates.md): advertised GPU resources whole, no new Xid in the kernel log since the
node's change began, the GPU Operator's validator Ready where the operator schedules one.
DCGM's diagnostics run only when the plan asks for them (`dcgm: {level, image}`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rollout.inputs.fieldtypes import Bool, ImageRef, Int, SpecModel

DEFAULT_DCGM_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
# How long each `dcgmi diag -r LEVEL` may take, pod start included (FACTS.md "DCGM
# diagnostics": level 1 seconds, 2 about two minutes, 3 about 15 minutes, 4 longer still).
DCGM_TIMEOUT_S = {1: 300, 2: 600, 3: 2_700, 4: 7_200}


class DcgmGate(SpecModel):
    """DCGM diagnostics in a pod holding all the node's GPUs: `dcgmi diag -r LEVEL -j`."""

    level: Annotated[Int, Field(ge=1, le=4)] = 1
    image: ImageRef = DEFAULT_DCGM_IMAGE

    @property
    def timeout_s(self) -> int:
        """The gate's deadline: it follows the level."""
        return DCGM_TIMEOUT_S[self.level]


class GatesPolicy(SpecModel):
    """Which health gates run before a node is returned to service."""

    # every GPU resource advertised again, allocatable equal to capacity
    resources: Bool = True
    # no Xid in the node's kernel log since its change began (by the kernel's own timestamps)
    xid: Bool = True
    # the GPU Operator's validator pod on the node Ready, where its deploy label schedules one
    validator: Bool = True
    # DCGM diagnostics on all the node's GPUs; off unless given
    dcgm: DcgmGate | None = None
