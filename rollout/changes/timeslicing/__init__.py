"""The time-slicing change kind: its planner (kind) over the device-plugin profile rules."""
