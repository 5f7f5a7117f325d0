"""The simulation loop: every controller of the lab cluster, ticking in one background thread.

One thread and a fixed order per tick (node lifecycle, operator, NVIDIADrivers, DaemonSets,
scheduler, kubelets, driver containers, MIG managers, upgrade controller) keep runs
deterministic enough to test; clients see the same eventual consistency they see on a real cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import CLUSTERPOLICIES
from rollout.lab.description import LabDescription
from rollout.lab.simulation.bootstrap import seed_cluster
from rollout.lab.simulation.clusterpolicy import ClusterPolicyController
from rollout.lab.simulation.cronjobs import CronJobController, JobController
from rollout.lab.simulation.daemonsets import DaemonSetController
from rollout.lab.simulation.driverpods import DriverContainers
from rollout.lab.simulation.endpointnodes import EndpointNodes, seed_endpoint_nodes
from rollout.lab.simulation.events import EventRecorder
from rollout.lab.simulation.gpuoperator import CLUSTER_POLICY_NAME
from rollout.lab.simulation.jobpods import JobPods, job_runner
from rollout.lab.simulation.kubelet import Kubelet
from rollout.lab.simulation.migmanager import MigManager
from rollout.lab.simulation.nodelifecycle import NodeLifecycleController
from rollout.lab.simulation.nvidiadrivers import NVIDIADriverController
from rollout.lab.simulation.probe import NodeRuntimeProbe
from rollout.lab.simulation.scheduler import Scheduler
from rollout.lab.simulation.timing import SimulationTimings
from rollout.lab.simulation.upgrade import UpgradeController
from rollout.lab.simulation.upgradestate import UpgradeTimings

log = logging.getLogger("rollout.lab.simulation")


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
        self._lifecycle = NodeLifecycleController(registry, clock)
        self._operator = ClusterPolicyController(registry)
        self._nvidia_drivers = NVIDIADriverController(registry)
        self._daemonsets = DaemonSetController(registry)
        self._endpoints = EndpointNodes(registry, {e.name: e.node for e in lab.endpoints})
        self._scheduler = Scheduler(
            registry, EventRecorder(registry, "default-scheduler", clock=clock), clock
        )
        self.kubelets = tuple(
            Kubelet(registry, node, index, probe, self.timings, clock)
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
        self._mig = MigManager(registry, lab.nodes, probe, self.timings.mig_step_s, clock)
        # scheduled rollouts (rollout schedule): CronJobs make Jobs, Jobs make pods
        batch_clock = schedule_clock or clock
        self._batch = (
            CronJobController(registry, batch_clock),
            JobController(registry, batch_clock),
        )
        # ... and the rollout image's Job pods run as its containers in a node (jobpods.py)
        self._jobpods = JobPods(registry, lab.api_host, batch_clock, job_runner(lab, probe))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._step_lock = threading.Lock()

    def seed(self) -> None:
        """Create the cluster's initial objects (idempotent)."""
        seed_cluster(self.registry, self.lab)
        seed_endpoint_nodes(self.registry, self.lab)

    def step(self) -> None:
        """One tick of every controller, in a fixed order."""
        with self._step_lock:
            policy = self.registry.find(CLUSTERPOLICIES, None, CLUSTER_POLICY_NAME)
            self._endpoints.reconcile()
            self._lifecycle.reconcile()
            self._operator.reconcile(policy)
            self._nvidia_drivers.reconcile(policy)
            self._daemonsets.reconcile()
            self._jobpods.claim()  # before the scheduler: no kubelet runs them
            self._scheduler.reconcile()
            for kubelet in self.kubelets:
                kubelet.sync(policy)
            self._drivers.sync()
            self._mig.sync(policy)
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
        unsettled = [k.name for k in self.kubelets if not k.settled()]
        if unsettled:
            # said, not silent: a toolkit still starting restarts containerd after `lab up`
            log.warning(
                "not settled within %gs (toolkit or device plugin still starting): %s",
                self.timings.settle_s,
                ", ".join(unsettled),
            )
        self._thread = threading.Thread(target=self._run, name="simulation", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for kubelet in self.kubelets:
            kubelet.close()
        self._mig.close()
        self._jobpods.close()

    def _run(self) -> None:
        while not self._stop.wait(self.timings.tick_s):
            try:
                self.step()
            except Exception:  # one bad tick must not stop the cluster
                log.exception("simulation tick failed")
