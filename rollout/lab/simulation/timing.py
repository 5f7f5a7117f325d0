"""Timing profiles of the simulated cluster: `fast` (the defaults, for tests) and `realistic`.

A profile is a set of SimulationTimings values, carried by the lab description's
"simulation" object (lab.json), which the control plane reads when it starts. `realistic`
is what a real node does, give or take:

- termination grace honoured: a deleted pod stays Terminating while its containers stop
  (2 s), and never longer than its terminationGracePeriodSeconds (the registry's bound, 30 s);
- CrashLoopBackOff with the kubelet's back-off: 10 s, doubled at each restart, 5 min at most;
- the device plugin registering with the kubelet a few seconds (5 s) after its pod runs;
- pods take 2 s to start and a smoke pod 3 s to run.
- each step of a MIG reconfiguration (operands paused, layout applied) 5 s.

The NotReady window while containerd restarts is not a number here: in every profile a
node is NotReady while its real containerd is down (Debian's RestartSec=5 after a SIGHUP).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rollout.errors import BadInput
from rollout.lab.description import LAB_FILE, LabDescription

REALISTIC: Mapping[str, float] = {
    "tick_s": 0.5,
    "pod_start_s": 2.0,
    "smoke_run_s": 3.0,
    "pod_termination_s": 30.0,
    "container_stop_s": 2.0,
    "crash_backoff_s": 10.0,
    "crash_backoff_max_s": 300.0,
    "plugin_registration_s": 5.0,
    "mig_step_s": 5.0,
}
PROFILES: Mapping[str, Mapping[str, float]] = {"fast": {}, "realistic": REALISTIC}


@dataclass(frozen=True)
class SimulationTimings:
    """Every delay of the simulated cluster, in seconds; tests shrink them all."""

    tick_s: float = 0.5
    pod_start_s: float = 0.2
    smoke_run_s: float = 1.0
    device_plugin_grace_s: float = 300.0
    upgrade_dwell_s: float = 0.5
    validation_timeout_s: float = 600.0
    # The upgrade controller's periodic reconcile (the operator's: 120 s) and how often a
    # failing driver container restarts.
    upgrade_resync_s: float = 2.0
    driver_restart_s: float = 0.2
    # A deleted running pod stays Terminating this long (capped by its grace period).
    pod_termination_s: float = 0.5
    # Kubelet: container stop, crash back-off (first, cap), device-plugin registration.
    container_stop_s: float = 0.0
    crash_backoff_s: float = 1.0
    crash_backoff_max_s: float = 5.0
    plugin_registration_s: float = 0.0
    # Each step of a MIG reconfiguration (pausing the operands, applying the layout).
    mig_step_s: float = 1.0
    # How long start() ticks for every node's toolkit and device plugin to come up.
    settle_s: float = 25.0

    @classmethod
    def from_lab(cls, lab: LabDescription) -> SimulationTimings:
        """Defaults, the lab's device-plugin grace, then its "simulation" overrides."""
        known = {f.name for f in dataclasses.fields(cls)}
        overrides = {k: float(v) for k, v in lab.timings.items() if k in known}
        timings = cls(device_plugin_grace_s=lab.device_plugin_grace_s)
        return dataclasses.replace(timings, **overrides)

    def crash_backoff_after(self, previous_s: float) -> float:
        """The kubelet's back-off after one of `previous_s`: the first, then doubled at each
        restart up to the cap."""
        return min(max(previous_s * 2, self.crash_backoff_s), self.crash_backoff_max_s)


def set_timing_profile(lab_dir: Path, name: str) -> None:
    """Write a profile into lab_dir/lab.json; the control plane started next runs with it."""
    if name not in PROFILES:
        raise BadInput(f"unknown timing profile {name!r}; known: {', '.join(PROFILES)}")
    path = lab_dir / LAB_FILE
    description = json.loads(path.read_text())
    simulation = {k: v for k, v in (description.get("simulation") or {}).items()}
    for key in REALISTIC:
        simulation.pop(key, None)
    simulation.update(PROFILES[name])
    description["simulation"] = simulation
    path.write_text(json.dumps(description, indent=2) + "\n")
