"""The entry of `changes:` that holds exactly one change, built from the change kinds' models
(rollout.changes.KINDS), and what every kind's model says of the GPU resources a node
advertises (kind). The models of registry, containerd, time-slicing and driver changes are
here too (registry, containerd, timeslicing, driver).

Import them from rollout.spec, the plan's one public face.
"""
