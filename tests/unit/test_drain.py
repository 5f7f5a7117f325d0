"""kubectl drain's pod selection, one case per rule and per combination, as data.

Each case is a pod as the API server sends it, read by the transport (`Pod.from_json`): the
drain rules classify the transport's own objects, as the facts and the drain step hand them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from rollout.drain import (
    BlockedPod,
    BlockReason,
    DrainSelection,
    EvictionBackoff,
    PodRef,
    SkippedPod,
    SkipReason,
    classify_pods,
    format_blocked,
)
from rollout.transports.kube import Pod

SKIP_LABEL = "nvidia.com/gpu-driver-upgrade-drain.skip"
NODE = "gpu-1"


def owner(kind: str, *, controller: bool | None = True) -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": "apps/v1", "kind": kind, "name": "x", "uid": "u"}
    if controller is not None:
        ref["controller"] = controller
    return ref


def make_pod(
    name: str = "web",
    *,
    namespace: str = "ml",
    owners: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    phase: str = "Running",
) -> Pod:
    """A pod from the API's JSON; by default a running ReplicaSet pod with no volumes."""
    return Pod.from_json(api_pod(name, namespace, owners, labels, annotations, volumes, phase))


def api_pod(
    name: str,
    namespace: str,
    owners: list[dict[str, Any]] | None,
    labels: dict[str, str] | None,
    annotations: dict[str, str] | None,
    volumes: list[dict[str, Any]] | None,
    phase: str,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [owner("ReplicaSet")] if owners is None else owners,
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"nodeName": NODE, "volumes": volumes or []},
        "status": {"phase": phase},
    }


EMPTYDIR = [{"name": "scratch", "emptyDir": {}}]
HOSTPATH = [{"name": "dev", "hostPath": {"path": "/dev"}}]
CONFIGMAP = [{"name": "cfg", "configMap": {"name": "c"}}]
MIRROR = {"kubernetes.io/config.mirror": "abc"}


@dataclass(frozen=True)
class Case:
    id: str
    pod: Pod
    expect: str  # "evict", a SkipReason, or blocking reasons joined by "+"
    force: bool = False
    delete_emptydir_data: bool = False
    selector: Mapping[str, str] | None = None
    skip_label: str | None = SKIP_LABEL
    warnings: tuple[BlockReason, ...] = field(default=())


CASES = [
    # the plain case
    Case("replicaset pod is evicted", make_pod(), "evict"),
    Case("statefulset pod is evicted", make_pod(owners=[owner("StatefulSet")]), "evict"),
    Case("job pod is evicted", make_pod(owners=[owner("Job")]), "evict"),
    Case("any controller kind manages a pod", make_pod(owners=[owner("MyOperatorCRD")]), "evict"),
    Case("configMap volume is not local storage", make_pod(volumes=CONFIGMAP), "evict"),
    Case("hostPath volume is not local storage", make_pod(volumes=HOSTPATH), "evict"),
    # DaemonSet: always ignored, whatever the flags
    Case("daemonset pod", make_pod(owners=[owner("DaemonSet")]), SkipReason.DAEMONSET.name),
    Case(
        "daemonset pod with emptyDir is skipped, not blocking",
        make_pod(owners=[owner("DaemonSet")], volumes=EMPTYDIR),
        SkipReason.DAEMONSET.name,
    ),
    Case(
        "daemonset pod skipped even with force",
        make_pod(owners=[owner("DaemonSet")]),
        SkipReason.DAEMONSET.name,
        force=True,
    ),
    Case(
        "finished daemonset pod reports DaemonSet first",
        make_pod(owners=[owner("DaemonSet")], phase="Succeeded"),
        SkipReason.DAEMONSET.name,
    ),
    Case(
        "daemonset owner without controller flag does not count",
        make_pod(owners=[owner("DaemonSet", controller=None)]),
        BlockReason.UNMANAGED.name,
    ),
    # mirror pods
    Case("mirror pod", make_pod(owners=[], annotations=MIRROR), SkipReason.MIRROR.name),
    Case(
        "mirror annotation with empty value still a mirror pod",
        make_pod(owners=[], annotations={"kubernetes.io/config.mirror": ""}),
        SkipReason.MIRROR.name,
    ),
    Case(
        "mirror pod with emptyDir is skipped",
        make_pod(owners=[], annotations=MIRROR, volumes=EMPTYDIR),
        SkipReason.MIRROR.name,
    ),
    Case(
        "node-owned mirror pod",
        make_pod(owners=[owner("Node")], annotations=MIRROR),
        SkipReason.MIRROR.name,
    ),
    Case(
        "other annotations make no mirror pod",
        make_pod(annotations={"kubernetes.io/config.source": "file"}),
        "evict",
    ),
    # finished pods
    Case("succeeded pod", make_pod(phase="Succeeded"), SkipReason.FINISHED.name),
    Case("failed pod", make_pod(phase="Failed"), SkipReason.FINISHED.name),
    Case(
        "finished unmanaged pod with emptyDir does not block",
        make_pod(owners=[], volumes=EMPTYDIR, phase="Failed"),
        SkipReason.FINISHED.name,
    ),
    Case("pending pod is evicted", make_pod(phase="Pending"), "evict"),
    Case("unknown phase is evicted", make_pod(phase="Unknown"), "evict"),
    # unmanaged pods
    Case("bare pod blocks", make_pod(owners=[]), BlockReason.UNMANAGED.name),
    Case(
        "owner that is not controller leaves pod unmanaged",
        make_pod(owners=[owner("ReplicaSet", controller=False)]),
        BlockReason.UNMANAGED.name,
    ),
    Case(
        "bare pod evicted with force, with a warning",
        make_pod(owners=[]),
        "evict",
        force=True,
        warnings=(BlockReason.UNMANAGED,),
    ),
    Case(
        "delete_emptydir_data does not lift the unmanaged rule",
        make_pod(owners=[]),
        BlockReason.UNMANAGED.name,
        delete_emptydir_data=True,
    ),
    # local storage
    Case("emptyDir blocks", make_pod(volumes=EMPTYDIR), BlockReason.LOCAL_STORAGE.name),
    Case(
        "memory-backed emptyDir blocks too",
        make_pod(volumes=[{"name": "shm", "emptyDir": {"medium": "Memory"}}]),
        BlockReason.LOCAL_STORAGE.name,
    ),
    Case(
        "emptyDir among other volumes blocks",
        make_pod(volumes=CONFIGMAP + HOSTPATH + EMPTYDIR),
        BlockReason.LOCAL_STORAGE.name,
    ),
    Case(
        "emptyDir evicted with delete_emptydir_data, with a warning",
        make_pod(volumes=EMPTYDIR),
        "evict",
        delete_emptydir_data=True,
        warnings=(BlockReason.LOCAL_STORAGE,),
    ),
    Case(
        "force does not lift the local storage rule",
        make_pod(volumes=EMPTYDIR),
        BlockReason.LOCAL_STORAGE.name,
        force=True,
    ),
    # both rules on one pod: every reason, kubectl's filter order (local storage first);
    # each override lifts its own rule and warns for it
    *(
        Case(
            id,
            make_pod(owners=[], volumes=EMPTYDIR),
            expect,
            force=force,
            delete_emptydir_data=delete_emptydir_data,
            warnings=warnings,
        )
        for id, force, delete_emptydir_data, expect, warnings in (
            (
                "bare pod with emptyDir names both reasons",
                False,
                False,
                "LOCAL_STORAGE+UNMANAGED",
                (),
            ),
            ("force alone leaves local storage", True, False, BlockReason.LOCAL_STORAGE.name, ()),
            (
                "delete_emptydir_data alone leaves unmanaged",
                False,
                True,
                BlockReason.UNMANAGED.name,
                (),
            ),
            (
                "both overrides evict with both warnings",
                True,
                True,
                "evict",
                (BlockReason.LOCAL_STORAGE, BlockReason.UNMANAGED),
            ),
        )
    ),
    # pod selector and skip label, applied before every other rule
    Case("selected pod", make_pod(labels={"app": "train"}), "evict", selector={"app": "train"}),
    Case(
        "unselected pod is skipped",
        make_pod(labels={"app": "web"}),
        SkipReason.NOT_SELECTED.name,
        selector={"app": "train"},
    ),
    Case(
        "unselected bare pod does not block",
        make_pod(owners=[], volumes=EMPTYDIR),
        SkipReason.NOT_SELECTED.name,
        selector={"app": "train"},
    ),
    Case(
        "skip label",
        make_pod(labels={SKIP_LABEL: "true"}),
        SkipReason.SKIP_LABEL.name,
    ),
    Case(
        "skip label on a bare pod with emptyDir: skipped, not blocking",
        make_pod(owners=[], volumes=EMPTYDIR, labels={SKIP_LABEL: "true"}),
        SkipReason.SKIP_LABEL.name,
    ),
    Case(
        "skip label beats DaemonSet",
        make_pod(owners=[owner("DaemonSet")], labels={SKIP_LABEL: "true"}),
        SkipReason.SKIP_LABEL.name,
    ),
    Case("skip label must be exactly true", make_pod(labels={SKIP_LABEL: "True"}), "evict"),
    Case("skip label false is no skip", make_pod(labels={SKIP_LABEL: "false"}), "evict"),
    Case(
        "no skip label configured",
        make_pod(labels={SKIP_LABEL: "true"}),
        "evict",
        skip_label=None,
    ),
    Case(
        "selector is checked before the skip label",
        make_pod(labels={SKIP_LABEL: "true"}),
        SkipReason.NOT_SELECTED.name,
        selector={"app": "train"},
    ),
    # odd shapes the API may return
    Case(
        "missing ownerReferences, labels and volumes",
        Pod.from_json({"metadata": {"name": "p", "namespace": "ml"}, "spec": {}, "status": {}}),
        BlockReason.UNMANAGED.name,
    ),
    Case(
        "null volumes",
        Pod.from_json(
            {
                "metadata": {"name": "p", "ownerReferences": [owner("Job")]},
                "spec": {"volumes": None},
                "status": {"phase": "Running"},
            }
        ),
        "evict",
    ),
]


def selector_for(wanted: Mapping[str, str] | None) -> Any:
    if wanted is None:
        return None
    return lambda labels: all(labels.get(k) == v for k, v in wanted.items())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rule(case: Case) -> None:
    selection = classify_pods(
        [case.pod],
        force=case.force,
        delete_emptydir_data=case.delete_emptydir_data,
        pod_selector=selector_for(case.selector),
        skip_label=case.skip_label,
    )
    ref = PodRef.from_pod(case.pod)
    if case.expect == "evict":
        assert selection == DrainSelection(
            to_evict=(ref,),
            skipped=(),
            blocking=(),
            overridden=(BlockedPod(ref, case.warnings),) if case.warnings else (),
        )
    elif case.expect in SkipReason.__members__:
        assert selection == DrainSelection((), (SkippedPod(ref, SkipReason[case.expect]),), ())
    else:
        reasons = tuple(BlockReason[name] for name in case.expect.split("+"))
        assert selection == DrainSelection((), (), (BlockedPod(ref, reasons),))
        assert selection.refused


def test_every_rule_has_a_case() -> None:
    covered = {name for case in CASES for name in case.expect.split("+")}
    assert set(SkipReason.__members__) | set(BlockReason.__members__) <= covered


def test_pod_ref_defaults_namespace_and_reads_node() -> None:
    assert PodRef.from_pod(Pod.from_json({"metadata": {"name": "p"}})) == PodRef(
        "default", "p", None
    )
    assert str(PodRef.from_pod(make_pod("a", namespace="ns"))) == "ns/a"
    assert PodRef.from_pod(make_pod()).node == NODE


MIXED = [
    make_pod("ds", owners=[owner("DaemonSet")]),
    make_pod("web-2"),
    make_pod("bare", owners=[]),
    make_pod("static", owners=[], annotations=MIRROR),
    make_pod("web-1"),
    make_pod("cache", volumes=EMPTYDIR),
    make_pod("done", phase="Succeeded"),
    make_pod("notebook", owners=[], volumes=EMPTYDIR, namespace="users"),
    make_pod("keep", labels={SKIP_LABEL: "true"}),
]


def classify_mixed(pods: list[Pod], **flags: bool) -> DrainSelection:
    return classify_pods(
        pods,
        force=flags.get("force", False),
        delete_emptydir_data=flags.get("delete_emptydir_data", False),
        pod_selector=None,
        skip_label=SKIP_LABEL,
    )


def names(refs: tuple[PodRef, ...]) -> list[str]:
    return [r.name for r in refs]


def test_mixed_node_keeps_input_order_in_every_group() -> None:
    selection = classify_mixed(MIXED)
    assert names(selection.to_evict) == ["web-2", "web-1"]
    assert [(s.pod.name, s.reason) for s in selection.skipped] == [
        ("ds", SkipReason.DAEMONSET),
        ("static", SkipReason.MIRROR),
        ("done", SkipReason.FINISHED),
        ("keep", SkipReason.SKIP_LABEL),
    ]
    assert [b.pod.name for b in selection.blocking] == ["bare", "cache", "notebook"]
    assert selection.warnings == ()


def test_every_pod_lands_in_exactly_one_group() -> None:
    for flags in ({}, {"force": True}, {"delete_emptydir_data": True}):
        selection = classify_mixed(MIXED, **flags)
        seen = (
            names(selection.to_evict)
            + [s.pod.name for s in selection.skipped]
            + [b.pod.name for b in selection.blocking]
        )
        assert sorted(seen) == sorted(p.name for p in MIXED)


def test_order_follows_input_not_names() -> None:
    forward = classify_mixed(MIXED, force=True, delete_emptydir_data=True)
    backward = classify_mixed(list(reversed(MIXED)), force=True, delete_emptydir_data=True)
    assert names(backward.to_evict) == list(reversed(names(forward.to_evict)))
    assert names(forward.to_evict) == ["web-2", "bare", "web-1", "cache", "notebook"]
    assert [str(w) for w in forward.warnings] == [
        "deleting Pods that declare no controller: ml/bare",
        "deleting Pods with local storage: ml/cache",
        "deleting Pods with local storage: users/notebook",
        "deleting Pods that declare no controller: users/notebook",
    ]


def test_classify_is_repeatable() -> None:
    assert classify_mixed(MIXED) == classify_mixed(MIXED)


def test_accepts_a_generator() -> None:
    selection = classify_mixed([])
    assert selection == DrainSelection((), (), ())
    generated = classify_pods(
        (p for p in MIXED),
        force=False,
        delete_emptydir_data=False,
        pod_selector=None,
        skip_label=SKIP_LABEL,
    )
    assert generated == classify_mixed(MIXED)


def test_refusal_message_names_every_pod_and_the_settings() -> None:
    message = classify_mixed(MIXED).refusal_message()
    assert message.splitlines() == [
        "drain of gpu-1 refused: 3 pods cannot be evicted",
        "  ml/bare: cannot delete Pods that declare no controller (use --force to override)",
        "  ml/cache: cannot delete Pods with local storage"
        " (use --delete-emptydir-data to override)",
        "  users/notebook: cannot delete Pods with local storage"
        " (use --delete-emptydir-data to override)",
        "  users/notebook: cannot delete Pods that declare no controller (use --force to override)",
        "to proceed, move these pods off the node first, or set in the plan:",
        "  policy.drain.force: true  (the pods are deleted and nothing recreates them)",
        "  policy.drain.delete_emptydir_data: true  (their emptyDir data is lost)",
    ]


def test_refusal_message_names_only_the_setting_needed() -> None:
    message = classify_mixed(MIXED, force=True).refusal_message()
    assert "policy.drain.delete_emptydir_data" in message
    assert "policy.drain.force" not in message
    assert "ml/bare" not in message
    assert "drain of gpu-1 refused: 2 pods cannot be evicted" in message


def test_refusal_message_for_one_pod_without_node() -> None:
    pod = Pod.from_json({"metadata": {"name": "p", "namespace": "ns"}})
    selection = classify_mixed([pod])
    assert selection.refusal_message().splitlines()[0] == "drain refused: 1 pod cannot be evicted"


def test_no_refusal_message_when_nothing_blocks() -> None:
    selection = classify_mixed([make_pod()])
    assert not selection.refused
    assert selection.refusal_message() == ""


# --- eviction backoff -----------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap() -> None:
    backoff = EvictionBackoff(timeout_s=1000, first_delay_s=1, factor=2, max_delay_s=16)
    assert [backoff.delay_s(n) for n in range(7)] == [1, 2, 4, 8, 16, 16, 16]


def test_backoff_huge_retry_number_does_not_overflow() -> None:
    assert EvictionBackoff(timeout_s=10).delay_s(10_000) == 16


def test_backoff_schedule_is_bounded_by_the_timeout() -> None:
    backoff = EvictionBackoff(timeout_s=60, first_delay_s=1, factor=2, max_delay_s=16)
    # 1+2+4+8+16 = 31, then 16 -> 47, then the last delay is cut to the 13 s left
    assert backoff.schedule_s() == (1, 2, 4, 8, 16, 16, 13)
    assert sum(backoff.schedule_s()) == 60


def test_backoff_constant_schedule() -> None:
    backoff = EvictionBackoff(timeout_s=20, first_delay_s=5, factor=1, max_delay_s=5)
    assert backoff.schedule_s() == (5, 5, 5, 5)


@pytest.mark.parametrize(
    ("retry", "elapsed_s", "expected"),
    [
        (0, 0.0, 1.0),
        (3, 10.0, 8.0),
        (4, 25.0, 5.0),  # 16 would overrun the 30 s timeout
        (4, 30.0, None),
        (0, 31.0, None),
    ],
)
def test_backoff_next_delay(retry: int, elapsed_s: float, expected: float | None) -> None:
    assert EvictionBackoff(timeout_s=30).next_delay_s(retry, elapsed_s) == expected


def test_backoff_zero_timeout_never_retries() -> None:
    backoff = EvictionBackoff(timeout_s=0)
    assert backoff.next_delay_s(0, 0.0) is None
    assert backoff.schedule_s() == ()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_s": -1},
        {"timeout_s": float("inf")},
        {"timeout_s": float("nan")},
        {"timeout_s": 10, "first_delay_s": 0},
        {"timeout_s": 10, "factor": 0.5},
        {"timeout_s": 10, "first_delay_s": 4, "max_delay_s": 2},
    ],
)
def test_backoff_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        EvictionBackoff(**kwargs)


def test_backoff_rejects_negative_retry() -> None:
    with pytest.raises(ValueError):
        EvictionBackoff(timeout_s=10).delay_s(-1)


# --- PDB timeout message --------------------------------------------------------------------


def test_format_blocked() -> None:
    pod = make_pod("trainer-0", namespace="research")
    assert format_blocked(pod, "trainer-pdb", 300.2) == (
        "drain of gpu-1 timed out after 300s: pod research/trainer-0 is protected by "
        "PodDisruptionBudget research/trainer-pdb (0 disruptions allowed)"
    )


def test_format_blocked_without_pdb_name_or_node() -> None:
    message = format_blocked(
        Pod.from_json({"metadata": {"name": "p", "namespace": "ns"}}), None, 59.6
    )
    assert message == (
        "drain of the node timed out after 60s: pod ns/p is protected by "
        "a PodDisruptionBudget (0 disruptions allowed)"
    )
