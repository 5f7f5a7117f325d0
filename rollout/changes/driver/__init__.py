"""The driver-upgrade change kind (host and operator modes): its plan model (model), its
planner (kind) and steps. Kept light: reading a plan loads the model alone.

What rollout knows of the driver on a node (nvidia-smi, packages, modules, the operator's
upgrade state) is the driver engine, rollout.driver, which this package imports."""
