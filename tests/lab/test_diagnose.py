"""`rollout diagnose` against the lab broken by `rollout lab break`, one scenario at a time.

Per scenario: diagnose names the right cause first, with evidence, and blames no healthy
neighbour (no error on another node). For the repairable ones, `diagnose --fix` writes a
plan that `rollout apply` carries out, after which diagnose reports the cluster healthy.
`lab heal` runs after each scenario, so the shared lab is left as it was found.

A scenario whose check is not in rollout/diagnose yet is a strict xfail naming the check:
it turns into a failure (XPASS) the moment the check lands, so the marker cannot outlive it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.lab.scenarios import (
    MISSING_PROFILE,
    MISSING_RUNTIME_CLASS,
    NVML_MISMATCH,
    POD_PREFIX,
    SCENARIOS,
    UNHEALTHY_GPU,
    XID,
)
from rollout.lab.simulation.kernellog import bus_of_gpu
from rollout.transports.kube import KubeClient
from tests.conftest import require
from tests.lab.labapi import api_lab, apply_args, diagnose_report
from tests.lab.test_lab_scenarios import (
    NODE_OF,
    OBSERVE,
    OBSERVED,
    all_advertise,
    settle,
    validators_ready,
)

DIAGNOSE_SOURCES = Path(__file__).resolve().parents[2] / "rollout" / "diagnose"

# scenario -> (the check that must come first, a word its evidence must contain)
EXPECTED: dict[str, tuple[str, str]] = {
    "shadowing": ("runtime.shadowing", "registry.toml"),
    "toolkit-dropin-removed": ("runtime.handler-missing", "nvidia"),
    "containerd-bad-import": ("runtime.containerd-down", "rollout-lab-missing.toml"),
    "profile-label-missing-key": ("operator.profile-label-missing-key", MISSING_PROFILE),
    "upgrade-failed": ("operator.upgrade-failed", "upgrade-failed"),
    "slots-used": ("advertising.slots-used", f"{POD_PREFIX}-slots-"),
    "requests-without-limits": ("pods.requests-without-limits", f"{POD_PREFIX}-no-limits-"),
    "runtimeclass-missing": ("pods.runtimeclass-missing", MISSING_RUNTIME_CLASS),
    "not-ready": ("node.not-ready", "Ready"),
    # the crash-looping plugin pod is the more specific cause of the resource going away
    "plugin-crash-loop": ("operator.operand-failing", "CrashLoopBackOff"),
    "unhealthy-device": ("advertising.unhealthy-devices", f"Xid {XID}"),
    "driver-library-mismatch": ("operator.driver-library-mismatch", NVML_MISMATCH),
    # the lab's validator reports no init container status: its own wait is the evidence
    "validator-stuck": ("operator.validator-not-ready", "PodInitializing"),
    "row-remap-pending": ("advertising.row-remap-pending", f"{bus_of_gpu(UNHEALTHY_GPU)}.0, 1"),
}
REPAIRABLE = ("shadowing", "profile-label-missing-key")
# Scenarios whose cause belongs to no node: the API refused a pod that therefore has none.
NODELESS = frozenset({"requests-without-limits"})
# Causes that are not faults: reported as warnings, the cluster still healthy (exit 0).
WARNINGS = frozenset({"slots-used", "validator-stuck", "row-remap-pending"})
# What diagnose does not do yet on the live lab, though its check exists (measured on the lab).
GAPS: dict[str, str] = {}
FIX_GAPS: dict[str, str] = {}


def check_implemented(check: str) -> bool:
    """Whether rollout/diagnose names the check id anywhere in its source."""
    if not DIAGNOSE_SOURCES.is_dir():
        return False
    return any(f'"{check}"' in p.read_text() for p in DIAGNOSE_SOURCES.rglob("*.py"))


def pending(scenario: str, gaps: dict[str, str] = GAPS) -> pytest.MarkDecorator:
    check = EXPECTED[scenario][0]
    if not check_implemented(check):
        reason = f"rollout diagnose has no {check} check yet (rollout/diagnose/)"
    else:
        reason = gaps.get(scenario, "")
    return pytest.mark.xfail(bool(reason), reason=reason, strict=True)


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return api_lab(request)


def assert_blames_only(
    report: dict[str, Any], node: str | None, check: str, word: str, severity: str = "error"
) -> None:
    findings = report["findings"]
    assert report["healthy"] is (severity != "error"), json.dumps(findings, indent=1)
    assert findings, report
    first = findings[0]
    assert (first["check"], first["node"]) == (check, node), json.dumps(findings, indent=1)
    assert first["severity"] == severity
    assert first["cause"] and first["command"] and first["branch"]
    assert first["evidence"], first
    assert word in "\n".join(str(e) for e in first["evidence"]) + str(first.get("pod")), first
    neighbours = [f for f in findings if f["severity"] == "error" and f["node"] != node]
    assert not neighbours, json.dumps(neighbours, indent=1)


@pytest.fixture
def healthy_lab(lab: Lab, kube: KubeClient) -> Iterator[Lab]:
    settle("every node to advertise its GPUs", lambda: all_advertise(lab, kube))
    try:
        yield lab
    finally:
        assert main(["lab", "heal", "--lab-dir", str(lab.lab_dir)]) == 0
        settle("every node to advertise its GPUs again", lambda: all_advertise(lab, kube))
        # a validator still waiting would be another node's warning in the next scenario
        settle("every validator to be Ready again", lambda: validators_ready(lab, kube))


@pytest.mark.lab
@pytest.mark.parametrize(
    "scenario",
    [pytest.param(s.name, marks=pending(s.name)) for s in SCENARIOS if s.name in OBSERVED],
)
def test_diagnose_names_the_cause_first(
    healthy_lab: Lab, kube: KubeClient, capsys: pytest.CaptureFixture[str], scenario: str
) -> None:
    lab = healthy_lab
    node = lab.find_node(NODE_OF[scenario])
    assert main(["lab", "break", scenario, node.name, "--lab-dir", str(lab.lab_dir)]) == 0
    OBSERVE[scenario](lab, kube, node)
    code, report = diagnose_report(lab, capsys)
    check, word = EXPECTED[scenario]
    severity = "warning" if scenario in WARNINGS else "error"
    assert_blames_only(report, None if scenario in NODELESS else node.name, check, word, severity)
    assert code == (0 if scenario in WARNINGS else 1)


@pytest.mark.lab
@pytest.mark.parametrize(
    "scenario", [pytest.param(s, marks=pending(s, {**GAPS, **FIX_GAPS})) for s in REPAIRABLE]
)
def test_fix_plan_applied_makes_the_lab_healthy(
    healthy_lab: Lab,
    kube: KubeClient,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    scenario: str,
) -> None:
    lab = healthy_lab
    node = lab.find_node(NODE_OF[scenario])
    assert main(["lab", "break", scenario, node.name, "--lab-dir", str(lab.lab_dir)]) == 0
    OBSERVE[scenario](lab, kube, node)
    plan = tmp_path / "plan.yaml"
    code, report = diagnose_report(lab, capsys, "--fix", str(plan))
    assert code == 1
    assert_blames_only(report, node.name, *EXPECTED[scenario])
    assert plan.is_file()
    applied = main(apply_args(lab, plan, tmp_path / "state"))
    assert applied == 0, capsys.readouterr()
    settle("every node to advertise its GPUs after the fix", lambda: all_advertise(lab, kube))
    code, report = diagnose_report(lab, capsys)
    assert report["healthy"] is True, json.dumps(report["findings"], indent=1)
    assert code == 0


# A version-2 registry drop-in, as a user writes it from containerd 1.x documentation.
V2_REGISTRY_DROPIN = "/etc/containerd/conf.d/50-rollout-test-registry.toml"
V2_REGISTRY = (
    '[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n'
)


@pytest.mark.lab
def test_a_v2_drop_in_that_2_1_ignores_is_found_live(
    healthy_lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the lab's containerd 2.1 node the toolkit's drop-in is version 3 and loads last, so a
    version-2 registry drop-in is ignored: the node's real `config dump` lacks its config_path,
    and `rollout diagnose` (live, as the README runs it) reports the file, a warning."""
    lab = healthy_lab
    nodes = [n for n in lab.nodes if n.containerd == "2.1"]
    if not nodes:
        require("the shared lab has no containerd 2.1 node")
    node = nodes[0]
    write = ["sh", "-c", f'printf %s "$1" > {V2_REGISTRY_DROPIN}', "sh", V2_REGISTRY]
    assert lab.ssh.run(node.address, write).ok
    try:
        dump = lab.ssh.run(node.address, ["containerd", "config", "dump"])
        assert dump.ok and 'config_path = "/etc/containerd/certs.d"' not in dump.stdout
        code, report = diagnose_report(lab, capsys)
        mine = [f for f in report["findings"] if f["check"] == "runtime.dropin-ignored"]
        assert [(f["node"], f["severity"]) for f in mine] == [(node.name, "warning")], mine
        assert V2_REGISTRY_DROPIN in mine[0]["cause"]
        evidence = "\n".join(mine[0]["evidence"])
        assert 'not loaded: plugins."io.containerd.grpc.v1.cri".registry.config_path' in evidence
        assert code == 0 and report["healthy"] is True  # a warning: no GPU is lost
    finally:
        assert lab.ssh.run(node.address, ["rm", "-f", V2_REGISTRY_DROPIN]).ok
