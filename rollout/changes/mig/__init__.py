"""MIG reconfiguration, one change kind: `mig: {config: NAME}` labels each node with a layout
of the GPU Operator's MIG manager and waits for it (docs/mig.md).

Its parts: the plan model (model), the layout engine (layout), the kind's planner (kind: KIND,
registered in rollout.changes.KINDS) and its steps (steps: mig.configure, mig.wait). The MIG
manager's contract (its labels, states, ConfigMap and pods) is rollout.facts.migmode's, which
diagnose reads too. Kept light: reading a plan loads the model alone.
"""
