"""The node's toolkit unit as its kubelet drives it: the toolkit pod's container is the unit.

The toolkit pod starting starts the unit (the drop-in is written and containerd SIGHUPed);
the pod going stops it (the drop-in is deleted and containerd signalled again). systemctl
blocks for a second or more, so each node's start and stop run one after another on a
worker thread of their own while the simulation keeps ticking.

The toolkit counts as *settled* once its unit runs and containerd has restarted since it
was started: only then do operand pods with the nvidia runtime class start, as the GPU
Operator's device plugin and validator wait for the toolkit's validation first.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from rollout.lab.simulation.probe import (
    NodeRuntimeProbe,
    RuntimeState,
    ToolkitAction,
    ToolkitOutcome,
)

log = logging.getLogger("rollout.lab.simulation")


@dataclass(eq=False)
class ToolkitUnit:
    """One node's toolkit unit and the pod that runs it."""

    probe: NodeRuntimeProbe
    node: str
    # The toolkit pod whose container the unit is (None: no pod runs it).
    pod_uid: str | None = None
    _pending: tuple[ToolkitAction, Future[ToolkitOutcome]] | None = field(default=None, init=False)
    _outcome: tuple[ToolkitAction, ToolkitOutcome] | None = field(default=None, init=False)
    _run_before_start: str | None = field(default=None, init=False)
    _pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"toolkit-{self.node}")

    def start(self, pod_uid: str, runtime: RuntimeState) -> None:
        """The toolkit pod's container starts: start the unit."""
        self.pod_uid = pod_uid
        self._run_before_start = runtime.containerd_run
        self._submit("start")

    def stop(self) -> None:
        """The toolkit pod goes: stop the unit (the drop-in is removed)."""
        self.pod_uid = None
        self._submit("stop")

    def forget(self) -> None:
        """The node rebooted: its unit is not running, whatever it did before."""
        self.pod_uid = None
        self._outcome = None

    def outcome(self) -> tuple[ToolkitAction, ToolkitOutcome] | None:
        """The last finished action and how it went; None while one is still running."""
        if self._pending is not None:
            action, future = self._pending
            if not future.done():
                return None
            self._pending = None
            try:
                self._outcome = (action, future.result())
            except Exception as error:  # a failed systemctl call is an outcome, not a crash
                self._outcome = (action, ToolkitOutcome(False, str(error)))
            log.info("toolkit on %s: %s -> %s", self.node, action, self._outcome[1])
        return self._outcome

    def settled(self, runtime: RuntimeState) -> bool:
        """Started, and containerd restarted since (it loaded what the toolkit wrote)."""
        done = self.outcome()
        return (
            done is not None
            and done[0] == "start"
            and done[1].ok
            and runtime.containerd_active
            and runtime.containerd_run != self._run_before_start
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _submit(self, action: ToolkitAction) -> None:
        self.outcome()  # fold a finished action in before queueing the next
        future = self._pool.submit(self.probe.run_toolkit, self.node, action)
        self._pending = (action, future)
