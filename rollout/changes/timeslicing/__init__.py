"""The time-slicing change kind: its plan model (model) and its planner (kind) over the
device-plugin profile rules. Kept light: reading a plan loads the model alone."""
