"""The entry of `changes:` that holds exactly one change, built from the change kinds' models
(rollout.changes.KINDS), and what every kind's model says of the GPU resources a node
advertises (kind). The models of registry, containerd, time-slicing and driver changes are
here too (registry, containerd, timeslicing, driver).

Import them from rollout.spec, the plan's one public face.

Why these four models stay here, one module per kind, and MIG's lives in its package
(rollout/changes/mig/model.py): rollout.spec re-exports them, and a model imports
rollout.spec.fieldtypes; under rollout/changes/<kind>/ each would load rollout.spec, which
imports it back (a circle). The kinds' table names each model where it is.
"""
