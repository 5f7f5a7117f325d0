"""The four kinds of change a plan can make on a GPU node, one module each (registry,
containerd, timeslicing, driver), and the entry of `changes:` that holds exactly one of them.

Import them from rollout.spec, the plan's one public face.
"""
