"""The run lock: one coordination.k8s.io Lease per cluster, so two runs never proceed at once.

Held while a run works and renewed in the background; when a run dies its lease stops being
renewed and expires after `duration_s`, so a crashed laptop does not lock the cluster
forever. A holder that finds its own lease (same identity, e.g. `rollout resume` of the same
run) takes it back at once.

`rollout apply` takes the lease before it creates its run, under the id the run will have,
so a refused apply leaves no run behind.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import TracebackType

from rollout.errors import RolloutError
from rollout.transports.errors import Conflict, NotFound
from rollout.transports.kube import KubeClient, Lease

LEASE_NAMESPACE = "kube-system"
LEASE_NAME = "rollout"
DURATION_S = 60
RENEW_EVERY_S = 15.0


class LeaseHeld(RolloutError):
    """Another run holds the cluster's rollout lease."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def run_identity(run_id: str, process: str | None = None) -> str:
    """The lease holder identity of a run: the same for its apply, resume and rollback.

    `process`: the pod of a scheduled run, whose next pod continues the same run: a second
    pod must be refused while the first one holds the lease, not take it over.
    """
    return f"rollout/{run_id}" + (f"/{process}" if process else "")


def lease_holder(kube: KubeClient, now: datetime | None = None) -> str | None:
    """Who holds the cluster's rollout lease now (None: nobody, or it expired)."""
    try:
        lease = kube.get_lease(LEASE_NAMESPACE, LEASE_NAME)
    except NotFound:
        return None
    if not lease.holder_identity or _expired(lease, now or utc_now()):
        return None
    return lease.holder_identity


@dataclasses.dataclass(eq=False)
class RunLease:
    """Acquire, renew in the background, and release the cluster's rollout lease."""

    kube: KubeClient
    identity: str
    _: dataclasses.KW_ONLY
    namespace: str = LEASE_NAMESPACE
    name: str = LEASE_NAME
    duration_s: int = DURATION_S
    renew_every_s: float = RENEW_EVERY_S
    clock: Callable[[], datetime] = utc_now
    lost: str | None = dataclasses.field(default=None, init=False)
    _lease: Lease | None = dataclasses.field(default=None, init=False)
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = dataclasses.field(default=None, init=False)

    def acquire(self) -> None:
        """Take the lease, or raise LeaseHeld naming the holder and when it expires."""
        now = self.clock()
        try:
            current = self.kube.get_lease(self.namespace, self.name)
        except NotFound:
            fresh = Lease(
                namespace=self.namespace,
                name=self.name,
                holder_identity=self.identity,
                lease_duration_s=self.duration_s,
                acquire_time=now,
                renew_time=now,
            )
            try:
                self._lease = self.kube.create_lease(fresh)
            except Conflict as exc:
                raise LeaseHeld(self._held_message(self._taken_just_now())) from exc
        else:
            if current.holder_identity not in (None, "", self.identity) and not _expired(
                current, now
            ):
                expires = (current.renew_time or now) + timedelta(
                    seconds=current.lease_duration_s or self.duration_s
                )
                raise LeaseHeld(
                    self._held_message(
                        f"held by {current.holder_identity}, renewed "
                        f"{_ago(current.renew_time, now)}; it expires at "
                        f"{expires.isoformat(timespec='seconds')} if that run is gone"
                    )
                )
            taken = dataclasses.replace(
                current,
                holder_identity=self.identity,
                lease_duration_s=self.duration_s,
                acquire_time=now,
                renew_time=now,
                lease_transitions=current.lease_transitions
                + (0 if current.holder_identity == self.identity else 1),
            )
            try:
                self._lease = self.kube.replace_lease(taken)
            except Conflict as exc:
                raise LeaseHeld(self._held_message(self._taken_just_now())) from exc
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        """Renew once; a Conflict means someone else took the lease: record it as lost."""
        if self._lease is None:
            return
        renewed = dataclasses.replace(self._lease, renew_time=self.clock())
        try:
            self._lease = self.kube.replace_lease(renewed)
        except Conflict:
            self.lost = f"lease {self.namespace}/{self.name} was taken by another run"

    def check(self) -> None:
        """Raise LeaseHeld when the lease was lost; called before every node."""
        if self.lost:
            raise LeaseHeld(self.lost)

    def release(self) -> None:
        """Stop renewing and give the lease up (holder cleared), so the next run starts at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._lease is None or self.lost:
            return
        try:
            current = self.kube.get_lease(self.namespace, self.name)
            if current.holder_identity == self.identity:
                self.kube.replace_lease(dataclasses.replace(current, holder_identity=""))
        except RolloutError:
            pass  # it expires on its own; releasing is a courtesy
        self._lease = None

    def __enter__(self) -> RunLease:
        """Acquire (LeaseHeld if another run holds it); released on leaving the block."""
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            try:
                self.renew()
            except RolloutError:
                continue  # API trouble: the next tick tries again, well before expiry

    def _taken_just_now(self) -> str:
        """Who won the race for the lease, for the refusal's message."""
        try:
            holder = self.kube.get_lease(self.namespace, self.name).holder_identity
        except RolloutError:
            holder = None
        return f"taken just now by {holder}" if holder else "another run took it just now"

    def _held_message(self, detail: str) -> str:
        return (
            f"another rollout run is working on this cluster (lease "
            f"{self.namespace}/{self.name} {detail}); wait for it, or resume that run"
        )


def _expired(lease: Lease, now: datetime) -> bool:
    if lease.renew_time is None:
        return True
    return lease.renew_time + timedelta(seconds=lease.lease_duration_s or DURATION_S) < now


def _ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "never"
    return f"{int((now - when).total_seconds())}s ago"
