"""Timing profiles of the simulated cluster: `fast` (the defaults, for tests) and `realistic`.

A profile is a set of SimulationTimings values, carried by the lab description's
"simulation" object (lab.json), which the control plane reads when it starts. `realistic`
is what a real node does, give or take:

- termination grace honoured: a deleted pod stays Terminating while its containers stop
  (2 s), and never longer than its terminationGracePeriodSeconds (the registry's bound, 30 s);
- CrashLoopBackOff with the kubelet's back-off: 10 s, doubled at each restart, 5 min at most;
- the device plugin registering with the kubelet a few seconds (5 s) after its pod runs;
- pods take 2 s to start and a smoke pod 3 s to run.

The NotReady window while containerd restarts is not a number here: in every profile a
node is NotReady while its real containerd is down (Debian's RestartSec=5 after a SIGHUP).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from rollout.errors import BadInput
from rollout.lab.description import LAB_FILE

REALISTIC: Mapping[str, float] = {
    "tick_s": 0.5,
    "pod_start_s": 2.0,
    "smoke_run_s": 3.0,
    "pod_termination_s": 30.0,
    "container_stop_s": 2.0,
    "crash_backoff_s": 10.0,
    "crash_backoff_max_s": 300.0,
    "plugin_registration_s": 5.0,
}
PROFILES: Mapping[str, Mapping[str, float]] = {"fast": {}, "realistic": REALISTIC}


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
