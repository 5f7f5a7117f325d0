"""The simulation loop: every controller of the lab cluster, ticking in one background thread.

One thread and a fixed order per tick (node lifecycle, operator, NVIDIADrivers, DaemonSets,
scheduler, kubelets, driver containers, upgrade controller) keep runs deterministic enough to test;
clients see the same eventual consistency they see on a real cluster.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import CLUSTERPOLICIES
from rollout.lab.description import LabDescription
from rollout.lab.simulation.bootstrap import seed_cluster
from rollout.lab.simulation.clusterpolicy import ClusterPolicyController
from rollout.lab.simulation.cronjobs import CronJobController, JobController
from rollout.lab.simulation.daemonsets import DaemonSetController
from rollout.lab.simulation.driverpods import DriverContainers
from rollout.lab.simulation.events import EventRecorder
from rollout.lab.simulation.gpuoperator import CLUSTER_POLICY_NAME
from rollout.lab.simulation.jobpods import JobPods
from rollout.lab.simulation.kubelet import Kubelet, KubeletTimings
from rollout.lab.simulation.nodelifecycle import NodeLifecycleController
from rollout.lab.simulation.nvidiadrivers import NVIDIADriverController
from rollout.lab.simulation.probe import NodeRuntimeProbe
from rollout.lab.simulation.scheduler import Scheduler
from rollout.lab.simulation.upgrade import UpgradeController
from rollout.lab.simulation.upgradestate import UpgradeTimings

log = logging.getLogger("rollout.lab.simulation")


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
    # How long start() ticks for every node's toolkit and device plugin to come up.
    settle_s: float = 25.0

    @classmethod
    def from_lab(cls, lab: LabDescription) -> SimulationTimings:
        """Defaults, the lab's device-plugin grace, then its "simulation" overrides."""
        known = {f.name for f in dataclasses.fields(cls)}
        overrides = {k: float(v) for k, v in lab.timings.items() if k in known}
        timings = cls(device_plugin_grace_s=lab.device_plugin_grace_s)
        return dataclasses.replace(timings, **overrides)

    def with_overrides(self, overrides: Mapping[str, float]) -> SimulationTimings:
        return dataclasses.replace(self, **dict(overrides))


class Simulation:
    """The lab cluster's controllers over one registry."""

    def __init__(
        self,
        registry: Registry,
        lab: LabDescription,
        probe: NodeRuntimeProbe,
        timings: SimulationTimings | None = None,
        clock: Callable[[], float] = time.time,
        schedule_clock: Callable[[], float] | None = None,
    ) -> None:
        """`schedule_clock` (tests only; default `clock`): the time of the CronJobs, the Jobs
        and the scheduled pods' window checks, ahead or faster than the rest of the cluster."""
        self.registry = registry
        self.lab = lab
        self.timings = timings or SimulationTimings.from_lab(lab)
        self._clock = clock
        kubelet_timings = KubeletTimings(
            pod_start_s=self.timings.pod_start_s,
            smoke_run_s=self.timings.smoke_run_s,
            device_plugin_grace_s=self.timings.device_plugin_grace_s,
            container_stop_s=self.timings.container_stop_s,
            crash_backoff_s=self.timings.crash_backoff_s,
            crash_backoff_max_s=self.timings.crash_backoff_max_s,
            plugin_registration_s=self.timings.plugin_registration_s,
        )
        self._lifecycle = NodeLifecycleController(registry, clock)
        self._operator = ClusterPolicyController(registry)
        self._nvidia_drivers = NVIDIADriverController(registry)
        self._daemonsets = DaemonSetController(registry)
        self._scheduler = Scheduler(
            registry, EventRecorder(registry, "default-scheduler", clock=clock), clock
        )
        self.kubelets = tuple(
            Kubelet(registry, node, index, probe, kubelet_timings, clock)
            for index, node in enumerate(lab.nodes)
        )
        self._drivers = DriverContainers(
            registry,
            {n.name: n.root for n in lab.nodes if n.root is not None},
            self.timings.driver_restart_s,
            clock,
        )
        self._upgrades = UpgradeController(
            registry,
            UpgradeTimings(
                self.timings.upgrade_dwell_s,
                self.timings.validation_timeout_s,
                self.timings.upgrade_resync_s,
            ),
            clock,
        )
        # scheduled rollouts (rollout schedule): CronJobs make Jobs, Jobs make pods
        batch_clock = schedule_clock or clock
        self._batch = (
            CronJobController(registry, batch_clock),
            JobController(registry, batch_clock),
        )
        # ... and the rollout image's Job pods run as processes on the lab host (jobpods.py)
        self._jobpods = JobPods(registry, lab.api_host, batch_clock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._step_lock = threading.Lock()

    def seed(self) -> None:
        """Create the cluster's initial objects (idempotent)."""
        seed_cluster(self.registry, self.lab)

    def step(self) -> None:
        """One tick of every controller, in a fixed order."""
        with self._step_lock:
            policy = self.registry.find(CLUSTERPOLICIES, None, CLUSTER_POLICY_NAME)
            self._lifecycle.reconcile()
            self._operator.reconcile(policy)
            self._nvidia_drivers.reconcile(policy)
            self._daemonsets.reconcile()
            self._jobpods.claim()  # before the scheduler: no kubelet runs them
            self._scheduler.reconcile()
            for kubelet in self.kubelets:
                kubelet.sync(policy)
            self._drivers.sync()
            self._upgrades.reconcile(policy)
            for controller in self._batch:
                controller.reconcile()
            self._jobpods.sync()
            self._lifecycle.reconcile()

    def start(self) -> Simulation:
        """Seed, tick until every node's toolkit has configured containerd and its device
        plugin registered (settle_s at most), then tick in a thread."""
        self.seed()
        self.step()
        deadline = time.monotonic() + self.timings.settle_s
        while not all(k.settled() for k in self.kubelets) and time.monotonic() < deadline:
            time.sleep(self.timings.tick_s)
            self.step()
        self._thread = threading.Thread(target=self._run, name="simulation", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for kubelet in self.kubelets:
            kubelet.close()
        self._jobpods.close()

    def _run(self) -> None:
        while not self._stop.wait(self.timings.tick_s):
            try:
                self.step()
            except Exception:  # one bad tick must not stop the cluster
                log.exception("simulation tick failed")
