"""policy.verify.gates: the health gates a node passes before it is returned to service.

Each gate is on by default and acts only where the cluster has what it reads (docs/gates.md):
advertised GPU resources whole, no new Xid in the kernel log since the node's change began,
the GPU Operator's validator Ready where the operator schedules one.
"""

from __future__ import annotations

from rollout.spec.fieldtypes import Bool, SpecModel


class GatesPolicy(SpecModel):
    """Which health gates run before a node is returned to service."""

    # every GPU resource advertised again, allocatable equal to capacity
    resources: Bool = True
    # no Xid in the node's kernel log since its change began (by the kernel's own timestamps)
    xid: Bool = True
    # the GPU Operator's validator pod on the node Ready, where its deploy label schedules one
    validator: Bool = True
