"""The entry of `changes:` that holds exactly one change, built from the change kinds' models
(rollout.changes.KINDS), and the enum of the kinds' keys (kind). Nothing here names a kind:
each kind's plan model lives in its package (rollout/changes/<kind>/model.py, the registry's
in rollout/changes/containerd/registrymodel.py), on rollout.changes.model.ChangeModel, and
loads no plan (rollout.spec), which loads it through the table.
"""
