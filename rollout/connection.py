"""A connection to a fleet: one SSH runner per inventory node and one Kubernetes client.

Opened once per command and shared by fact gathering and every step, so each node gets
exactly one SSH connection for a whole run. The client is built in a thread of its own
(importing kubernetes and reading the kubeconfig take a good part of `plan -i`), while the
nodes' SSH handshakes and commands are in flight; whatever needs it first waits for it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from rollout.closeable import Closeable
from rollout.errors import RolloutError
from rollout.facts import FleetFacts
from rollout.facts.live import gather_fleet_facts
from rollout.inventory import load_inventory
from rollout.spec import Spec
from rollout.transports.fanout import close_runners
from rollout.transports.ssh import SshOptions, SshRunner

if TYPE_CHECKING:
    from rollout.transports.kube import KubeClient


def connect_cluster(kubeconfig: str | None, context: str | None) -> KubeClient:
    """The client of the kubeconfig's cluster (KubeConfigError where it cannot be read)."""
    # imported here, in the connection's thread: kubernetes loads beside the SSH round trips
    from rollout.transports.kube import KubeClient

    return KubeClient.from_kubeconfig(kubeconfig, context)


def close_client(built: Future[KubeClient]) -> None:
    """Close a client once built; one whose kubeconfig failed holds nothing."""
    if built.exception() is None:
        built.result().close()


class FleetConnection(Closeable):
    """SSH runners (lazily connected) for an inventory, and a client for its cluster."""

    def __init__(
        self,
        inventory: Path,
        kubeconfig: str | None,
        context: str | None,
        *,
        accept_new_host_keys: bool = False,
    ) -> None:
        self.inventory_path = inventory
        self.inventory = load_inventory(inventory)
        options = SshOptions(accept_new_host_keys=accept_new_host_keys)
        self.runners = {host.name: SshRunner(host, options) for host in self.inventory.hosts}
        # not a daemon: a client still being built when the command ends is built and closed
        builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-kube")
        self._kube = builder.submit(connect_cluster, kubeconfig, context)
        builder.shutdown(wait=False)

    @property
    def kube(self) -> KubeClient:
        """The cluster's client, once built; the kubeconfig's KubeConfigError is raised here."""
        return self._kube.result()

    def gather(self, spec: Spec, max_parallel: int = 8) -> FleetFacts:
        """Fresh facts of every inventory node, probed in parallel (bounded)."""
        try:
            return gather_fleet_facts(
                spec,
                self.runners,
                self._kube.result,
                max_parallel=max_parallel,
                source=str(self.inventory_path),
            )
        except RolloutError:
            # a kubeconfig that cannot be read is the error, as when it was read before the
            # nodes were reached
            self._kube.result()
            raise

    def close(self) -> None:
        close_runners(self.runners)
        self._kube.add_done_callback(close_client)
