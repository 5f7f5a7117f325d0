"""`rollout diagnose` of a node whose MIG manager failed, in a lab of its own (one node): real
kubectl labels the node with a layout after `lab break mig-manager-failed`, the lab's MIG
manager reports `failed` and logs why, and diagnose, reading the node over SSH and the API,
names the failed state with the manager pod's log tail; healed and labelled back with the
layout its GPUs have, the node has no MIG finding left."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from rollout.transports.kube import KubeClient
from tests.lab.labapi import diagnose_report
from tests.lab.test_cluster_shared import own_lab
from tests.lab.test_lab_mig import configure, lab_cli

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

FAILED = "operator.mig-config-failed"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("migdiag") / "lab", ("1.7",), gpus=2) as built:
        yield built


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kubectl-home")


def mig_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["check"].startswith("operator.mig")]


def test_diagnose_names_a_failed_layout_with_the_managers_log(
    lab: Lab, kube: KubeClient, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = lab.nodes[0].name
    configure(lab, kube, home, "all-3g.20gb")
    assert lab_cli(lab, "break", "mig-manager-failed", node) == 0
    try:
        configure(lab, kube, home, "all-1g.10gb", state="failed")
        code, report = diagnose_report(lab, capsys)
        assert code == 1
        [failed] = mig_findings(report)
        assert (failed["node"], failed["check"], failed["severity"]) == (node, FAILED, "error")
        assert "failed to apply layout 'all-1g.10gb'" in failed["cause"]
        evidence = failed["evidence"]
        assert (
            evidence[0] == "nvidia.com/mig.config=all-1g.10gb, nvidia.com/mig.config.state=failed"
        )
        assert any(
            e.startswith("MIG manager pod gpu-operator/nvidia-mig-manager-") for e in evidence
        )
        assert "log: Unable to apply MIG config" in evidence, evidence
        assert failed["command"].startswith("kubectl logs -n gpu-operator nvidia-mig-manager-")
    finally:
        assert lab_cli(lab, "heal", node) == 0
    # the manager acts on a change of the label: back to the layout the GPUs have
    configure(lab, kube, home, "all-3g.20gb")
    _, report = diagnose_report(lab, capsys)
    assert mig_findings(report) == []
