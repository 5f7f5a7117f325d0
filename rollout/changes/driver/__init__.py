"""The driver-upgrade change kind (host and operator modes): its planner (kind)."""
