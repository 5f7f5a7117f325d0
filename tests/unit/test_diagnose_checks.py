"""Each diagnose check from recorded facts: the cases of data/diagnose/cases.yaml.

Every case breaks one thing on examples/facts (its broken node repaired first) and expects
the first finding of the broken node (or pod), its severity and evidence, and no error on
any other node: diagnose never blames a healthy neighbour.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rollout.diagnose import Severity, diagnose
from tests.unit.diagnose_facts import NOW, build_facts, load_cases

DEFAULTS, CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_check(case: Mapping[str, Any], tmp_path: Path) -> None:
    fleet = build_facts(
        tmp_path / "facts",
        all_nodes={**DEFAULTS["all_nodes"], **case.get("all_nodes", {})},
        node=case.get("node"),
        node_yaml=case.get("node_yaml"),
        files=case.get("files"),
        cluster=case.get("cluster", DEFAULTS["cluster"]),
    )
    diagnosis = diagnose(fleet, NOW)
    problems = [f for f in diagnosis.findings if f.severity is not Severity.INFO]
    if case["first"] is None:
        assert diagnosis.healthy
        assert problems == []
        return
    severity = Severity(case["severity"])
    node, pod = case.get("node"), case.get("pod")
    mine = [
        f
        for f in diagnosis.findings
        if (f.severity is not Severity.INFO or severity is Severity.INFO)
        and (pod is None or f.pod == pod)
        and (node is None or f.node == node)
    ]
    assert mine, diagnosis.findings
    first = mine[0]
    assert (first.check, first.severity) == (case["first"], severity), mine
    evidence = "\n".join(first.evidence)
    for text in case.get("evidence", []):
        assert text in evidence, (text, first.evidence)
    for check in case.get("also", []):
        assert check in {f.check for f in mine}
    if "also_pod" in case:
        assert case["also_pod"] in {f.check for f in diagnosis.findings if f.pod}
    assert diagnosis.healthy is (severity is not Severity.ERROR)
    if case.get("neighbours_healthy", True):
        blamed = [
            f
            for f in diagnosis.findings
            if f.severity is Severity.ERROR and f.node not in (None, node) and f.pod is None
        ]
        assert blamed == []
    assert (
        first.cause
        and first.command
        and first.branch.value in first.check.split(".")[0] + " advertising"
    )


def test_findings_sorted_errors_first_most_specific_first(tmp_path: Path) -> None:
    fleet = build_facts(
        tmp_path / "facts",
        all_nodes=DEFAULTS["all_nodes"],
        node="gpu-a-2",
        node_yaml={"allocatable": {"nvidia.com/gpu": "0"}, "labels": {"x": "y"}},
        files={
            "/etc/containerd/conf.d/registry.toml": (
                '[plugins."io.containerd.grpc.v1.cri".registry]\nconfig_path = "/x"\n'
            )
        },
        cluster=DEFAULTS["cluster"],
    )
    checks = [f.check for f in diagnose(fleet, NOW).findings if f.node == "gpu-a-2"]
    assert checks[:3] == [
        "runtime.shadowing",
        "runtime.handler-missing",
        "advertising.not-registered",
    ]
    assert checks[-1] == "advertising.resources"


def test_named_nodes_only_and_unknown_node_is_bad_input(tmp_path: Path) -> None:
    from rollout.errors import BadInput

    fleet = build_facts(tmp_path / "facts", all_nodes=DEFAULTS["all_nodes"])
    assert diagnose(fleet, NOW, ["gpu-a-1"]).nodes == ("gpu-a-1",)
    with pytest.raises(BadInput, match="no facts for node"):
        diagnose(fleet, NOW, ["gpu-zz"])
    with pytest.raises(BadInput, match="no pod"):
        diagnose(fleet, NOW, pod="ml/none")


def test_recorded_facts_without_diagnose_fields_still_diagnose(tmp_path: Path) -> None:
    """Facts recorded for `plan` alone: no capacity, no service: those checks stay silent."""
    fleet = build_facts(tmp_path / "facts")
    diagnosis = diagnose(fleet, NOW)
    assert diagnosis.healthy and diagnosis.findings == ()
