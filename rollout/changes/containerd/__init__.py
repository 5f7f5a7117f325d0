"""The registry and containerd change kinds: their planner (kind) over the containerd engine."""
