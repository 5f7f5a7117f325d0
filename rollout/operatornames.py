"""The GPU Operator's names that plans and facts both use: where the operator runs, and the
label its driver-upgrade controller walks each node through (FACTS.md "Operator-managed driver
upgrades"). Imports nothing, so the input model (rollout.spec) can name them without loading
the facts layer that reads them off the cluster."""

# Where the operator runs its operands and keeps the ConfigMap spec.devicePlugin.config names
OPERATOR_NAMESPACE = "gpu-operator"
# The operator deploys an operand on a node while its `nvidia.com/gpu.deploy.<operand>` label
# is true (gpu.wait reads the validator's; a driver upgrade pauses them all)
DEPLOY_LABEL_PREFIX = "nvidia.com/gpu.deploy."
# The upgrade controller's state of each node, and the states rollout reads or writes
UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_DONE = "upgrade-done"
UPGRADE_FAILED = "upgrade-failed"
UPGRADE_REQUIRED = "upgrade-required"
# What the device plugin advertises a GPU as; with renameByDefault: true a time-sliced GPU
# is advertised under the shared name instead (rollout.facts.pods names them for the facts)
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = f"{GPU_RESOURCE}.shared"
# a MIG device as the device plugin advertises it under the mixed strategy: <prefix><profile>
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
