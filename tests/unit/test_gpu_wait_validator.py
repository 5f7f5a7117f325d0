"""gpu.wait waits, after the GPUs are advertised, for the GPU Operator's own signal that the
node's GPU stack works again: its validator pod on the node Ready (where the node's deploy
label schedules one). Bounded by verify.gpu_wait_timeout_s, and said in the step's result."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rollout.run import Journal
from rollout.steps.base import StepFailed
from rollout.steps.gpu_wait import VALIDATOR_DEPLOY_LABEL, GpuWaitStep
from tests.unit.test_steps_kube import (
    FakeKube,
    add_pod,
    assert_done,
    make_context,
    make_facts,
    make_spec,
)

VALIDATOR = {"app": "nvidia-operator-validator"}


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


def advertise(kube: FakeKube, validator_label: str | None) -> None:
    labels = dict(kube.node.labels)
    if validator_label is not None:
        labels[VALIDATOR_DEPLOY_LABEL] = validator_label
    kube.node = replace(
        kube.node,
        labels=labels,
        capacity={"nvidia.com/gpu": "2"},
        allocatable={"nvidia.com/gpu": "2"},
    )


class ReadyOnThirdRead(FakeKube):
    """The validator's pod turns Ready at the third read of it (its init containers rerun)."""

    reads = 0

    def list_pods(self, *args: object, **kw: str | None):  # type: ignore[no-untyped-def]
        if kw.get("label_selector") == "app=nvidia-operator-validator":
            self.reads += 1
            if self.reads == 3:
                pod = self.pods[("ml", "nvidia-operator-validator-x")]
                self.pods[("ml", pod.name)] = replace(pod, ready=True)
        return super().list_pods(*args, **kw)  # type: ignore[arg-type]


def test_gpu_wait_waits_for_the_validator_after_the_gpus_are_advertised(journal: Journal) -> None:
    slow = ReadyOnThirdRead()
    advertise(slow, "true")
    add_pod(slow, "nvidia-operator-validator-x", owner="DaemonSet", labels=VALIDATOR)
    lines: list[str] = []
    result = GpuWaitStep().apply(make_context(slow, journal, lines=lines))
    assert_done(result, "allocatable nvidia.com/gpu = 2")
    assert "the GPU Operator's validator ml/nvidia-operator-validator-x Ready" in result.detail
    assert slow.reads == 3
    assert any("waiting for the GPU Operator's validator" in line for line in lines)


def test_gpu_wait_fails_naming_a_validator_that_never_becomes_ready(
    kube: FakeKube,
    journal: Journal,
) -> None:
    advertise(kube, "true")
    add_pod(
        kube,
        "nvidia-operator-validator-x",
        owner="DaemonSet",
        labels=VALIDATOR,
        container_reasons=("PodInitializing",),
    )
    spec = make_spec(policy="policy: {verify: {gpu_wait_timeout_s: 3}}\n")
    with pytest.raises(StepFailed) as failed:
        GpuWaitStep().apply(make_context(kube, journal, spec=spec))
    message = str(failed.value)
    assert "the node advertises its GPUs, but the GPU Operator's validator" in message
    assert "was not Ready within 3s" in message
    assert "validator pod ml/nvidia-operator-validator-x" in message


def test_gpu_wait_fails_when_the_scheduled_validator_has_no_pod(
    kube: FakeKube,
    journal: Journal,
) -> None:
    advertise(kube, "true")
    spec = make_spec(policy="policy: {verify: {gpu_wait_timeout_s: 2}}\n")
    with pytest.raises(StepFailed, match="no validator pod on the node, though"):
        GpuWaitStep().apply(make_context(kube, journal, spec=spec))


@pytest.mark.parametrize("label", [None, "false", "paused-for-driver-upgrade"])
def test_gpu_wait_needs_no_validator_where_none_is_scheduled(
    kube: FakeKube,
    journal: Journal,
    label: str | None,
) -> None:
    advertise(kube, label)
    result = GpuWaitStep().apply(make_context(kube, journal))
    assert_done(result, "allocatable nvidia.com/gpu = 2")
    assert "validator" not in result.detail


@pytest.mark.parametrize(
    ("label", "action"),
    [
        (
            "true",
            "wait for allocatable nvidia.com/gpu = 2, then the GPU Operator's validator "
            "(app=nvidia-operator-validator) Ready",
        ),
        ("false", "wait for allocatable nvidia.com/gpu = 2"),
    ],
)
def test_gpu_wait_plans_the_validator_wait_where_one_is_scheduled(label: str, action: str) -> None:
    facts = make_facts(gpus=2, labels={VALIDATOR_DEPLOY_LABEL: label})
    assert GpuWaitStep().plan_change(facts, make_spec()).action == action
