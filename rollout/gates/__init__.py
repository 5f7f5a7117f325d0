"""Health gates: what a node must show before rollout returns it to service (docs/gates.md).

Pure readings of what the node and the API report; the gate steps (rollout/steps/gates.py)
fetch them and fail the node with the evidence.
"""
