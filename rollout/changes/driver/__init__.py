"""The driver-upgrade change kind (host and operator modes): its planner (kind) and steps.

What rollout knows of the driver on a node (nvidia-smi, packages, modules, the operator's
upgrade state) is the driver engine, rollout.driver, which this package imports."""
