"""The DCGM gate: `dcgmi diag -j` read test by test and GPU by GPU, and what the gate decides.

The samples in data/dcgm follow dcgmi's JSON writer (NVIDIA/DCGM dcgmi/Diag.cpp): DCGM 4's
entity results with a test summary, and DCGM 3's tree with one Deployment result for all GPUs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rollout.errors import InputErrors
from rollout.facts import load_recorded_facts
from rollout.gates.dcgm import DcgmReadingError, DcgmResult, DcgmStatus, parse_dcgm_output
from rollout.run import Journal
from rollout.spec import Spec, parse_spec
from rollout.spec.gates import DcgmGate
from rollout.steps import step_traits
from rollout.steps.base import StepContext
from rollout.steps.gates import check_dcgm, gate_names, read_gates
from rollout.steps.traits import REQUEST_BOUND_S
from rollout.transports.kube import Pod
from tests.examples import FACTS
from tests.unit.test_steps_kube import FakeKube, make_context, make_facts, make_spec

DATA = Path(__file__).parent / "data" / "dcgm"
GATES_OFF = "      resources: false\n      xid: false\n      validator: false\n"


def sample(name: str) -> str:
    return (DATA / name).read_text()


def test_dcgm_4_output_names_the_failing_test_and_its_gpu() -> None:
    reading = parse_dcgm_output(sample("level2-fail-gpu1.json"))
    (failed,) = reading.failed
    assert (failed.test, failed.gpu, failed.status) == ("memory", 1, DcgmStatus.FAIL)
    assert "memory mismatch was detected on GPU 1" in failed.warnings[0]
    assert failed.describe().startswith("memory: Fail on GPU 1 (A memory mismatch")
    assert reading.summary() == (
        "software Pass (GPU 0, 1); pcie GPU 0 Pass, GPU 1 Skip; memory GPU 0 Pass, GPU 1 Fail"
    )


def test_dcgm_3_output_gives_one_deployment_result_for_every_gpu() -> None:
    reading = parse_dcgm_output(sample("level1-dcgm3-pass.json"))
    assert reading.failed == ()
    assert reading.results[0] == DcgmResult("Denylist", None, DcgmStatus.PASS)
    assert reading.results[-1] == DcgmResult("Inforom", None, DcgmStatus.SKIP)
    assert len(reading.results) == 9


def test_statuses_are_read_without_case_and_an_unknown_one_fails() -> None:
    doc = (
        '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": ['
        '{"name": "memory", "results": [{"gpu_id": "0", "status": "PASS"}, '
        '{"gpu_id": "1", "status": "weird"}]}]}]}}'
    )
    reading = parse_dcgm_output(doc)
    assert [(r.gpu, r.status) for r in reading.results] == [
        (0, DcgmStatus.PASS),
        (1, DcgmStatus.FAIL),
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (sample("runtime-error.json"), "could not run the diagnostic: Error: Diagnostic could"),
        ("Error: unable to establish a connection to the host engine", "no JSON document"),
        ('{"DCGM Diagnostic": {"test_categories": []}}', "lists no test result"),
        ('{"something": "else"}', "no 'DCGM Diagnostic'"),
        ('{"DCGM Diagnostic": ', "unreadable JSON"),
    ],
)
def test_output_the_gate_cannot_read_is_an_error(text: str, says: str) -> None:
    with pytest.raises(DcgmReadingError, match=says):
        parse_dcgm_output(text)


# ---------------------------------------------------------------------- the gate's decisions


def dcgm_spec(level: int = 1, gates: str = "") -> Spec:
    policy = f"policy:\n  verify:\n    gates:\n{gates}      dcgm: {{level: {level}}}\n"
    return make_spec(policy=policy)


def dcgm_gate(ctx: StepContext) -> DcgmGate:
    gate = ctx.spec.policy.verify.gates.dcgm
    assert gate is not None
    return gate


class DcgmKube(FakeKube):
    """A node with two GPUs; the diagnostic's pod ends as `pod_phase` with `log`."""

    def __init__(self, log: str, pod_phase: str = "Succeeded", allocatable: str = "2") -> None:
        super().__init__()
        self.node = replace(
            self.node,
            capacity={"nvidia.com/gpu": "2"},
            allocatable={"nvidia.com/gpu": allocatable},
        )
        self.smoke_pod = Pod("", "", uid="dcgm", resource_version="1", phase=pod_phase)
        self.log = log
        self.manifests: list[dict[str, Any]] = []

    def create_pod(self, namespace: str, manifest: Any) -> Pod:
        self.manifests.append(manifest)
        return super().create_pod(namespace, manifest)

    def read_pod_log(
        self, namespace: str, name: str, container: str | None = None, tail_lines: int | None = None
    ) -> str:
        return self.log


def test_the_diagnostic_runs_in_a_pod_holding_every_gpu_and_records_each_test(
    journal: Journal,
) -> None:
    kube = DcgmKube(sample("level1-dcgm3-pass.json"))
    ctx = make_context(kube, journal, spec=dcgm_spec(level=2))
    problem, summary = check_dcgm(ctx, kube.node, dcgm_gate(ctx))
    assert problem is None
    assert summary.startswith("dcgm level 2 (Denylist Pass; NVML Library Pass;")
    (manifest,) = kube.manifests
    (container,) = manifest["spec"]["containers"]
    assert container["command"] == ["dcgmi", "diag", "-r", "2", "-j"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert container["image"] == "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
    assert manifest["metadata"]["name"].startswith("rollout-dcgm-gpu-1-")
    assert kube.pods == {}, "the pod is deleted after"


def test_a_failing_test_fails_the_gate_naming_it(journal: Journal) -> None:
    # dcgmi exits non-zero when a test fails; its JSON is still the evidence
    kube = DcgmKube(sample("level2-fail-gpu1.json"), pod_phase="Failed")
    ctx = make_context(kube, journal, spec=dcgm_spec(level=2))
    problem, _ = check_dcgm(ctx, kube.node, dcgm_gate(ctx))
    assert problem is not None
    assert problem.startswith("dcgm: dcgm level 2 failed: memory: Fail on GPU 1 (A memory")


def test_a_pod_that_never_finishes_fails_the_gate_with_the_levels_timeout(
    journal: Journal,
) -> None:
    kube = DcgmKube("", pod_phase="Pending")
    ctx = make_context(kube, journal, spec=dcgm_spec(level=1))
    problem, _ = check_dcgm(ctx, kube.node, dcgm_gate(ctx))
    assert problem is not None and "not finished after" in problem
    assert "level 1's timeout 300s" in problem


def test_unreadable_output_fails_the_gate_with_the_log(journal: Journal) -> None:
    kube = DcgmKube("dcgmi: command not found\n", pod_phase="Failed")
    ctx = make_context(kube, journal, spec=dcgm_spec())
    problem, _ = check_dcgm(ctx, kube.node, dcgm_gate(ctx))
    assert problem is not None
    assert "no JSON document" in problem and "dcgmi: command not found" in problem


def test_no_allocatable_gpu_fails_the_gate_without_a_pod(journal: Journal) -> None:
    kube = DcgmKube("", allocatable="0")
    ctx = make_context(kube, journal, spec=dcgm_spec())
    problem, _ = check_dcgm(ctx, kube.node, dcgm_gate(ctx))
    assert (
        problem == "dcgm: the node has no allocatable nvidia.com/gpu to give the diagnostic's pod"
    )
    assert kube.manifests == []


def test_the_gates_step_runs_the_diagnostic_and_the_soak_does_not(journal: Journal) -> None:
    kube = DcgmKube(sample("level2-fail-gpu1.json"), pod_phase="Failed")
    ctx = make_context(kube, journal, spec=dcgm_spec(gates=GATES_OFF), facts=make_facts())
    assert read_gates(ctx) == ("", [])  # the soak's reading: no pod
    assert kube.manifests == []
    problem, passed = read_gates(ctx, diagnostics=True)
    assert problem.startswith("health gate failed: dcgm: dcgm level 1 failed: memory")
    assert passed == []
    assert kube.node.unschedulable, "cordoned for the evidence"


def test_plan_lists_the_dcgm_gate_with_its_levels_timeout_only_when_on() -> None:
    node = next(f for f in load_recorded_facts(FACTS).nodes if f.gpus.count)
    on = gate_names(dcgm_spec(level=3), node)
    assert any("DCGM diagnostics level 3" in n and "timeout 2700s for level 3" in n for n in on)
    assert not any("DCGM" in n for n in gate_names(make_spec(), node))


@pytest.mark.parametrize("level", [0, 5])
def test_a_level_outside_1_to_4_is_refused(level: int) -> None:
    with pytest.raises(InputErrors, match="dcgm"):
        parse_spec(
            "apiVersion: rollout/v1\nkind: Plan\nmetadata: {name: u}\ntargets: {nodes: [a]}\n"
            "changes:\n  - containerd: {settings: {enable_cdi: true}}\n"
            f"policy:\n  verify:\n    gates:\n      dcgm: {{level: {level}}}\n",
            "u.yaml",
        )


def test_the_gates_steps_worst_duration_follows_the_dcgm_level() -> None:
    traits = step_traits()["gates"]
    assert traits.worst_s(make_spec().policy) == REQUEST_BOUND_S
    assert traits.worst_s(dcgm_spec(level=3).policy) == REQUEST_BOUND_S + 2700
    grants = {(g.resource, g.verb) for g in traits.grants}
    assert {("pods", "create"), ("pods", "delete"), ("pods/log", "get")} <= grants
