"""Which pods a drain evicts, skips or refuses on, with kubectl drain's rules, as pure functions.

The facts and the drain step list the pods of a node through the API and hand the transport's
`Pod` objects here, unchanged; nothing in this module talks to a cluster, so `rollout plan`
can show the same decision `rollout apply` will act on, and every rule is a data-driven test.

The rules follow kubectl's drain filters (kubectl/pkg/drain/filters.go), in kubectl's order,
with three deliberate differences, each documented where it applies:

- DaemonSet-managed pods are always left alone, as with ``--ignore-daemonsets``: the GPU
  Operator's own pods (device plugin, toolkit, driver) are DaemonSet pods on every GPU node.
- Finished pods (Succeeded/Failed) are skipped rather than deleted: they run no containers,
  so a containerd restart cannot hurt them, and deleting them would throw away their logs.
- A blocked pod lists every reason it blocks, not only the first, so one plan edit fixes all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from rollout.spec import DrainPolicy
from rollout.transports.kube import Pod

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


class SkipReason(Enum):
    """Why a pod on the node is not evicted, and is no obstacle to the drain either."""

    NOT_SELECTED = "not matching the pod selector"
    SKIP_LABEL = "carries the drain skip label"
    DAEMONSET = "DaemonSet-managed"
    MIRROR = "mirror pod"
    FINISHED = "already finished"


class BlockReason(Enum):
    """Why kubectl drain would refuse to evict a pod, and the plan setting that overrides it."""

    UNMANAGED = "unmanaged"
    LOCAL_STORAGE = "local-storage"

    @property
    def wording(self) -> BlockWording:
        return _BLOCK_WORDING[self]


@dataclass(frozen=True)
class BlockWording:
    """What is said of one refusal, in kubectl's words where kubectl says it."""

    message: str  # kubectl's refusal, so operators recognise it
    plan_setting: str  # the plan field that lifts the refusal
    consequence: str  # what the override costs, said next to the setting so nobody sets it blind
    override_warning: str  # kubectl's warning when the override lets such a pod be evicted


_BLOCK_WORDING = {
    BlockReason.UNMANAGED: BlockWording(
        message="cannot delete Pods that declare no controller (use --force to override)",
        plan_setting="policy.drain.force",
        consequence="the pods are deleted and nothing recreates them",
        override_warning="deleting Pods that declare no controller",
    ),
    BlockReason.LOCAL_STORAGE: BlockWording(
        message="cannot delete Pods with local storage (use --delete-emptydir-data to override)",
        plan_setting="policy.drain.delete_emptydir_data",
        consequence="their emptyDir data is lost",
        override_warning="deleting Pods with local storage",
    ),
}


@dataclass(frozen=True)
class PodRef:
    """One pod, by the names an eviction and an operator need."""

    namespace: str
    name: str
    node: str | None = None

    @classmethod
    def from_pod(cls, pod: Pod) -> PodRef:
        return cls(namespace=pod.namespace or "default", name=pod.name, node=pod.node_name or None)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class SkippedPod:
    pod: PodRef
    reason: SkipReason


@dataclass(frozen=True)
class BlockedPod:
    """A pod kubectl drain refuses to evict, with every reason, in kubectl's filter order."""

    pod: PodRef
    reasons: tuple[BlockReason, ...]


@dataclass(frozen=True)
class DrainSelection:
    """The decision for every pod on a node; each group keeps the order the pods came in.

    `blocking` holds the pods and reasons no plan setting lifts; `overridden` the pods in
    `to_evict` that kubectl would refuse on, evicted because the plan overrides every reason.
    """

    to_evict: tuple[PodRef, ...]
    skipped: tuple[SkippedPod, ...]
    blocking: tuple[BlockedPod, ...]
    overridden: tuple[BlockedPod, ...] = ()

    @property
    def warnings(self) -> tuple[str, ...]:
        """kubectl's warning for every overridden refusal, pod by pod."""
        return tuple(
            f"{reason.wording.override_warning}: {blocked.pod}"
            for blocked in self.overridden
            for reason in blocked.reasons
        )

    @property
    def refused(self) -> bool:
        """True when kubectl drain would evict nothing at all, as it refuses on any blocker."""
        return bool(self.blocking)

    def refusal_message(self) -> str:
        """Every blocking pod with namespace/name and reason, and the plan setting to change."""
        if not self.blocking:
            return ""
        nodes = sorted({b.pod.node for b in self.blocking if b.pod.node})
        where = f"drain of {', '.join(nodes)}" if nodes else "drain"
        count = len(self.blocking)
        lines = [f"{where} refused: {count} pod{'s' if count != 1 else ''} cannot be evicted"]
        for blocked in self.blocking:
            lines.extend(f"  {blocked.pod}: {reason.wording.message}" for reason in blocked.reasons)
        needed = [r for r in BlockReason if any(r in b.reasons for b in self.blocking)]
        lines.append("to proceed, move these pods off the node first, or set in the plan:")
        lines.extend(f"  {r.wording.plan_setting}: true  ({r.wording.consequence})" for r in needed)
        return "\n".join(lines)


def classify_pods(
    pods: Iterable[Pod],
    *,
    force: bool,
    delete_emptydir_data: bool,
    pod_selector: Callable[[Mapping[str, str]], bool] | None,
    skip_label: str | None,
) -> DrainSelection:
    """Sort the pods of one node into evicted, skipped and blocking, as kubectl drain would.

    DaemonSet-managed pods are always skipped, as kubectl does with ``--ignore-daemonsets``
    (always on here: a GPU node without DaemonSet pods does not exist). kubectl's deletion
    of orphaned DaemonSet pods under ``--force`` is not reproduced: it needs an API lookup.
    Pods failing `pod_selector` or carrying ``<skip_label>=true`` are skipped before any
    other rule, as kubectl and the GPU Operator never list them.
    """
    to_evict: list[PodRef] = []
    skipped: list[SkippedPod] = []
    blocking: list[BlockedPod] = []
    overridden: list[BlockedPod] = []
    lifted = {BlockReason.UNMANAGED: force, BlockReason.LOCAL_STORAGE: delete_emptydir_data}
    for pod in pods:
        ref = PodRef.from_pod(pod)
        skip = _skip_reason(pod, pod_selector=pod_selector, skip_label=skip_label)
        if skip is not None:
            skipped.append(SkippedPod(ref, skip))
            continue
        reasons = _block_reasons(pod)
        still_blocking = tuple(r for r in reasons if not lifted[r])
        if still_blocking:
            blocking.append(BlockedPod(ref, still_blocking))
            continue
        to_evict.append(ref)
        if reasons:
            overridden.append(BlockedPod(ref, reasons))
    return DrainSelection(tuple(to_evict), tuple(skipped), tuple(blocking), tuple(overridden))


def _skip_reason(
    pod: Pod,
    *,
    pod_selector: Callable[[Mapping[str, str]], bool] | None,
    skip_label: str | None,
) -> SkipReason | None:
    if pod_selector is not None and not pod_selector(pod.labels):
        return SkipReason.NOT_SELECTED
    # The GPU Operator selects with `<skip_label>!=true`: only the exact value "true" skips.
    if skip_label and pod.labels.get(skip_label) == "true":
        return SkipReason.SKIP_LABEL
    # Only the owner marked controller: true counts; other owners do not make a pod managed.
    controller = pod.controller
    if controller is not None and controller.kind == "DaemonSet":
        return SkipReason.DAEMONSET
    # kubectl checks only that the mirror annotation exists, whatever its value.
    if pod.is_mirror:
        return SkipReason.MIRROR
    if pod.phase in FINISHED_PHASES:
        return SkipReason.FINISHED
    return None


def _block_reasons(pod: Pod) -> tuple[BlockReason, ...]:
    reasons: list[BlockReason] = []
    if pod.uses_empty_dir:
        reasons.append(BlockReason.LOCAL_STORAGE)
    if pod.controller is None:
        reasons.append(BlockReason.UNMANAGED)
    return tuple(reasons)


@dataclass(frozen=True)
class EvictionBackoff:
    """When to retry an eviction the API refused with 429 (a PodDisruptionBudget said no).

    Deterministic and jitter-free: one drain evicts one node's pods, so there is no herd to
    spread, and a fixed schedule makes the timeout message and the tests exact. Delays grow
    from `first_delay_s` by `factor` up to `max_delay_s`; the last one is cut so the retries
    never outlast `timeout_s`. A `timeout_s` of 0 means no retry at all: the plan caps the
    drain timeout, so 0 cannot mean "wait forever" as it does for kubectl.
    """

    timeout_s: float
    first_delay_s: float = 1.0
    factor: float = 2.0
    max_delay_s: float = 16.0

    def __post_init__(self) -> None:
        if not self.timeout_s >= 0 or math.isinf(self.timeout_s):
            raise ValueError(f"timeout_s must be a finite number >= 0, not {self.timeout_s}")
        if not self.first_delay_s > 0:
            raise ValueError(f"first_delay_s must be > 0, not {self.first_delay_s}")
        if not self.factor >= 1:
            raise ValueError(f"factor must be >= 1, not {self.factor}")
        if not self.max_delay_s >= self.first_delay_s:
            raise ValueError("max_delay_s must be >= first_delay_s")

    def delay_s(self, retry: int) -> float:
        """The uncut delay before retry number `retry` (0 is the first retry)."""
        if retry < 0:
            raise ValueError(f"retry must be >= 0, not {retry}")
        # Compare exponents rather than computing factor**retry, which overflows for long runs.
        if self.factor > 1 and retry > math.log(self.max_delay_s / self.first_delay_s, self.factor):
            return self.max_delay_s
        return min(self.first_delay_s * self.factor**retry, self.max_delay_s)

    def next_delay_s(self, retry: int, elapsed_s: float) -> float | None:
        """Seconds to wait before retry `retry`, or None when the drain timeout is spent."""
        remaining_s = self.timeout_s - elapsed_s
        if remaining_s <= 0:
            return None
        return min(self.delay_s(retry), remaining_s)

    def schedule_s(self) -> tuple[float, ...]:
        """Every delay in order, as if each eviction call took no time; sums to the timeout."""
        delays: list[float] = []
        elapsed_s = 0.0
        while (delay := self.next_delay_s(len(delays), elapsed_s)) is not None:
            delays.append(delay)
            elapsed_s += delay
        return tuple(delays)


def format_blocked(pod: Pod, pdb_name: str | None, waited_s: float) -> str:
    """The message for a drain that timed out on a pod a PodDisruptionBudget protects."""
    ref = PodRef.from_pod(pod)
    node = ref.node or "the node"
    # A PodDisruptionBudget only ever covers pods of its own namespace.
    budget = (
        f"PodDisruptionBudget {ref.namespace}/{pdb_name}" if pdb_name else "a PodDisruptionBudget"
    )
    return (
        f"drain of {node} timed out after {round(waited_s)}s: pod {ref} is protected by "
        f"{budget} (0 disruptions allowed)"
    )


def classify_for_policy(pods: Iterable[Pod], policy: DrainPolicy) -> DrainSelection:
    """classify_pods with the plan's drain policy: what the plan shows and the step does."""
    return classify_pods(
        pods,
        force=policy.force,
        delete_emptydir_data=policy.delete_emptydir_data,
        pod_selector=None if policy.pod_selector.is_empty else policy.pod_selector.matches,
        skip_label=policy.skip_label or None,
    )
