"""The registry and containerd change kinds: their plan models (registrymodel, model) and
their planner (kind) over the containerd engine. Kept light: reading a plan loads the models
alone."""
