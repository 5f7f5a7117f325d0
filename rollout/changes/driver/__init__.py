"""The driver-upgrade change kind (host and operator modes): its plan model (model) and its
planner (kind). Kept light: reading a plan loads the model alone."""
