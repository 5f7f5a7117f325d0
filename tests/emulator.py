"""The lab's API emulator in the test's own process, reached through a real KubeClient."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rollout.lab.apiserver import ApiServer, Registry
from rollout.transports.kube import KubeClient


@contextmanager
def emulated_kube(registry: Registry | None = None, *namespaces: str) -> Iterator[KubeClient]:
    """A KubeClient on an emulator serving `registry` (a new, empty one unless given), with
    `namespaces` made first; client and server stopped when the block ends."""
    served = Registry() if registry is None else registry
    for namespace in namespaces:
        served.ensure_namespace(namespace)
    with ApiServer.start(served) as server, KubeClient.from_url(server.url) as kube:
        yield kube
