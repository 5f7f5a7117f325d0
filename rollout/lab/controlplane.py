"""The lab's control plane: the emulated API server plus the simulated cluster, one process.

As a process: `python -m rollout.lab.controlplane --lab-dir DIR [--port N]` reads DIR/lab.json,
writes DIR/controlplane.pid, logs to DIR/controlplane.log, answers /healthz once serving and
exits cleanly on SIGTERM or SIGINT. In process (tests): `ControlPlane.start(lab, probe)`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from rollout.errors import ExitCode, RolloutError
from rollout.lab.apiserver.faults import ApiFaultInjector
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.server import ApiServer
from rollout.lab.controlplane_process import LOG_FILE, PID_FILE
from rollout.lab.description import LAB_FILE, LabDescription
from rollout.lab.simulation.engine import Simulation
from rollout.lab.simulation.probe import NodeRuntimeProbe, RunningConfigProbe
from rollout.lab.simulation.timing import SimulationTimings
from rollout.lab.sshfaults import injector_for_lab

log = logging.getLogger("rollout.lab.controlplane")


@dataclass(eq=False)
class ControlPlane:
    """A running API server and simulation; stop() ends both."""

    server: ApiServer
    simulation: Simulation

    @classmethod
    def start(
        cls,
        lab: LabDescription,
        probe: NodeRuntimeProbe,
        *,
        host: str | None = None,
        port: int | None = None,
        timings: SimulationTimings | None = None,
    ) -> ControlPlane:
        """Serve on host:port (default: the lab's api; port 0: ephemeral) and start simulating.

        The cluster is seeded and has ticked once before the server accepts requests."""
        timings = timings or SimulationTimings.from_lab(lab)
        registry = Registry(pod_termination_s=timings.pod_termination_s)
        simulation = Simulation(registry, lab, probe, timings)
        simulation.start()
        try:
            server = ApiServer.start(
                registry, host or lab.api_host, lab.api_port if port is None else port
            )
        except OSError:
            simulation.stop()
            raise
        return cls(server, simulation)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def registry(self) -> Registry:
        return self.server.registry

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.simulation.stop()
        self.server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rollout.lab.controlplane",
        description="Serve the lab's Kubernetes API and simulate its cluster.",
    )
    parser.add_argument("--lab-dir", type=Path, required=True, help="holds lab.json")
    parser.add_argument("--port", type=int, default=None, help="override api.port of lab.json")
    parser.add_argument("--host", default=None, help="override api.host of lab.json")
    args = parser.parse_args(argv)
    lab_dir: Path = args.lab_dir
    logging.basicConfig(
        filename=str(lab_dir / LOG_FILE),
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        lab = LabDescription.from_file(lab_dir / LAB_FILE)
        plane = ControlPlane.start(
            lab, RunningConfigProbe.from_lab(lab), host=args.host, port=args.port
        )
    except RolloutError as error:
        log.error("%s", error)
        print(error, file=sys.stderr)
        return error.exit_code
    except OSError as error:
        log.error("cannot serve: %s", error)
        print(f"cannot serve the lab API: {error}", file=sys.stderr)
        return ExitCode.FAILED
    plane.server.inject_faults(ApiFaultInjector(lab_dir))  # the lab's faults.json, if any
    ssh_faults = injector_for_lab(lab_dir, [(n.name, n.address) for n in lab.nodes]).start()
    stopping = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    pid_file = lab_dir / PID_FILE
    pid_file.write_text(f"{os.getpid()}\n")
    log.info("serving %s for %d nodes", plane.url, len(lab.nodes))
    try:
        while not stopping.wait(0.5):
            pass
    finally:
        log.info("stopping")
        ssh_faults.stop()
        plane.stop()
        pid_file.unlink(missing_ok=True)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
