"""The lab cluster's simulated components: kubelet and device plugin, scheduler, DaemonSet
controller, node lifecycle, smoke-pod runner and the GPU Operator's driver upgrade controller.
"""

from rollout.lab.description import GpuDescription, LabDescription, NodeDescription
from rollout.lab.simulation.engine import Simulation
from rollout.lab.simulation.probe import FixedRuntimeProbe, NodeRuntimeProbe, RunningConfigProbe
from rollout.lab.simulation.timing import SimulationTimings

__all__ = [
    "FixedRuntimeProbe",
    "GpuDescription",
    "LabDescription",
    "NodeDescription",
    "NodeRuntimeProbe",
    "RunningConfigProbe",
    "Simulation",
    "SimulationTimings",
]
