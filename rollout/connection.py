"""A connection to a fleet: one SSH runner per inventory node and one Kubernetes client.

Opened once per command and shared by fact gathering and every step, so each node gets
exactly one SSH connection for a whole run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rollout.closeable import Closeable
from rollout.facts import FleetFacts
from rollout.facts.live import gather_fleet_facts
from rollout.facts.progress import GatherProgress
from rollout.inventory import load_inventory
from rollout.spec import Spec
from rollout.transports.fanout import close_runners
from rollout.transports.hostkeys import KnownHostsBook
from rollout.transports.kube import KubeClient
from rollout.transports.ssh import SshOptions, SshRunner


class FleetConnection(Closeable):
    """SSH runners (lazily connected) for an inventory, and a client for its cluster."""

    def __init__(
        self,
        inventory: Path,
        kubeconfig: str | None,
        context: str | None,
        *,
        accept_new_host_keys: bool = False,
        handshake_timeout_s: float | None = None,
    ) -> None:
        """`handshake_timeout_s`: SshOptions.handshake_timeout_s (its default when None)."""
        self.inventory_path = inventory
        self.inventory = load_inventory(inventory)
        options = SshOptions(accept_new_host_keys=accept_new_host_keys)
        if handshake_timeout_s is not None:
            options = replace(options, handshake_timeout_s=handshake_timeout_s)
        book = KnownHostsBook()  # each known_hosts file parsed once for the whole fleet
        self.runners = {host.name: SshRunner(host, options, book) for host in self.inventory.hosts}
        self.kube = KubeClient.from_kubeconfig(kubeconfig, context)

    def gather(
        self,
        spec: Spec,
        max_parallel: int = 8,
        progress: GatherProgress | None = None,
        *,
        release: bool = False,
    ) -> FleetFacts:
        """Fresh facts of every inventory node, probed in parallel (bounded); with `release`
        each node's connection closed once read (rollout.facts.live.gather_fleet_facts)."""
        return gather_fleet_facts(
            spec,
            self.runners,
            self.kube,
            max_parallel=max_parallel,
            source=str(self.inventory_path),
            progress=progress,
            release=release,
        )

    def close(self) -> None:
        close_runners(self.runners)
        self.kube.close()
