"""`rollout diagnose` and `rollout facts`: exit codes, every output format, --fix, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.cli import main
from rollout.containerd import find_unloaded
from rollout.spec import load_spec
from tests.planning import sharing_config
from tests.unit.diagnose_facts import EXAMPLES, build_facts, load_cases

DEFAULTS, _ = load_cases()
FINDING_KEYS = {"node", "pod", "branch", "check", "cause", "evidence", "command", "severity"}
V2_REGISTRY = (
    '[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n'
)


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    build_facts(tmp_path / "healthy", all_nodes=DEFAULTS["all_nodes"], cluster=DEFAULTS["cluster"])
    return tmp_path / "healthy"


def run(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str, str]:
    code = main(["diagnose", *words])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("output", ["text", "markdown", "json"])
def test_healthy_exits_0_in_every_format(
    healthy: Path, output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--facts", str(healthy), "--output", output)
    assert code == 0
    if output == "json":
        assert json.loads(out) == {
            "schema_version": 1,
            "healthy": True,
            "nodes": ["gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1"],
            "findings": json.loads(out)["findings"],
        }
        assert {f["severity"] for f in json.loads(out)["findings"]} <= {"info"}
    else:
        assert "healthy" in out


@pytest.mark.parametrize("output", ["text", "markdown", "json"])
def test_broken_node_exits_1_naming_the_cause(
    output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--facts", str(EXAMPLES), "--output", output)
    assert code == 1
    assert "runtime.shadowing" in out and "gpu-a-3" in out
    if output == "json":
        data = json.loads(out)
        assert data["healthy"] is False
        assert data["findings"][0]["check"] == "runtime.shadowing"
        for finding in data["findings"]:
            assert set(finding) == FINDING_KEYS
            assert isinstance(finding["evidence"], list)
            assert finding["severity"] in ("error", "warning", "info")
            assert finding["branch"] in ("advertising", "runtime", "operator", "pods")


def test_healthy_neighbours_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "gpu-a-1", "gpu-b-1", "--facts", str(EXAMPLES), "-o", "json")
    assert code == 0
    assert json.loads(out)["nodes"] == ["gpu-a-1", "gpu-b-1"]


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ([], "where do the facts come from"),
        (["--facts", "nowhere"], "facts directory not found"),
        (["gpu-zz", "--facts", str(EXAMPLES)], "no facts for node"),
        (["--pod", "no-slash", "--facts", str(EXAMPLES)], "NAMESPACE/NAME"),
        (["--pod", "ml/none", "--facts", str(EXAMPLES)], "no pod ml/none"),
        (["--facts", str(EXAMPLES), "-i", "inv.yaml"], "pass one"),
        (["--facts", str(EXAMPLES), "--output", "xml"], "invalid choice"),
    ],
)
def test_bad_input_exits_2(
    words: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, *words)
    assert code == 2
    assert message in err


def test_text_escapes_hostile_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_facts(
        tmp_path / "f",
        all_nodes=DEFAULTS["all_nodes"],
        node="gpu-a-1",
        node_yaml={"labels": {"nvidia.com/device-plugin.config": "[bold]x\x1b"}},
        cluster={
            "runtime_classes": {"nvidia": "nvidia"},
            "cluster_policy": {"devicePlugin": {"config": {"name": "ts"}}},
            "configmaps": {"gpu-operator/ts": {"default": "version: v1\n"}},
        },
    )
    code, out, _ = run(capsys, "--facts", str(tmp_path / "f"), "--color", "never")
    assert code == 1
    assert "[bold]x\\x1b" in out and "\x1b" not in out


def test_fix_writes_a_plan_that_rollout_plan_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fix = tmp_path / "fix.yaml"
    code, _, err = run(capsys, "--facts", str(EXAMPLES), "--fix", str(fix), "-o", "json")
    assert code == 1
    assert "wrote" in err
    spec = load_spec(fix)
    assert spec.targets.nodes == ("gpu-a-3",) or list(spec.targets.nodes) == ["gpu-a-3"]
    assert main(["plan", str(fix), "--facts", str(EXAMPLES)]) == 0
    out, _ = capsys.readouterr()
    assert "repair:" in out and "runtime handlers nvidia" in out


def fix_for_profile_label(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    label: str,
    replicas: str,
    profiles: dict[str, str],
) -> tuple[Path, dict[str, Any]]:
    """gpu-a-2 labelled with a profile its ConfigMap lacks; --fix's time-slicing change."""
    facts = tmp_path / "f"
    build_facts(
        facts,
        all_nodes=DEFAULTS["all_nodes"],
        node="gpu-a-2",
        node_yaml={
            "labels": {
                "nvidia.com/device-plugin.config": label,
                "nvidia.com/gpu.replicas": replicas,
            }
        },
        cluster={
            "runtime_classes": {"nvidia": "nvidia"},
            "cluster_policy": {"devicePlugin": {"config": {"name": "time-slicing-config"}}},
            "configmaps": {"gpu-operator/time-slicing-config": profiles},
        },
    )
    fix = tmp_path / "fix.yaml"
    assert run(capsys, "--facts", str(facts), "--fix", str(fix))[0] == 1
    change = yaml.safe_load(fix.read_text())["changes"][0]["time-slicing"]
    assert change["profile"] == label
    assert "# repairs operator.profile-label-missing-key on gpu-a-2:" in fix.read_text()
    assert f"# how: the node's nvidia.com/device-plugin.config label names '{label}'" in (
        fix.read_text()
    )
    assert main(["plan", str(fix), "--facts", str(facts)]) == 0
    return facts, change


def test_fix_profile_label_missing_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, change = fix_for_profile_label(tmp_path, capsys, "ts-8", "8", {"default": "version: v1\n"})
    assert change["config"]["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 8}
    ]


def test_fix_gives_an_unshared_node_a_profile_without_sharing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiles = {"default": "version: v1\n", "ts-4": sharing_config(4)}
    _, change = fix_for_profile_label(tmp_path, capsys, "typo", "1", profiles)
    assert change["config"] == {"version": "v1"}
    out, _ = capsys.readouterr()
    assert "add key 'typo'" in out
    assert "restart" in out  # the label already names the key: the device plugin restarts
    # no shared-memory warning for a profile that shares nothing
    assert "does not divide it" not in out


def test_fix_leaves_what_needs_a_person(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = tmp_path / "f"
    build_facts(
        facts,
        all_nodes=DEFAULTS["all_nodes"],
        node="gpu-b-1",
        node_yaml={"labels": {"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}},
        cluster=DEFAULTS["cluster"],
    )
    fix = tmp_path / "fix.yaml"
    code, _, err = run(capsys, "--facts", str(facts), "--fix", str(fix))
    assert code == 1
    assert not fix.exists()
    # no ClusterPolicy in the facts: the driver is not the operator's to retry
    assert "needs a person: gpu-b-1: operator.upgrade-failed: relabel the node" in err
    assert "nothing rollout can repair" in err


def test_fix_retries_a_failed_operator_upgrade_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """upgrade-failed under an operator-managed driver: a driver change to the version the
    ClusterPolicy asks for, retrying the failed node; the shadowing elsewhere waits (the
    label would halt its run)."""
    facts = tmp_path / "f"
    served = {"nvidia.com/gpu.deploy.driver": "true"}
    build_facts(
        facts,
        all_nodes={**DEFAULTS["all_nodes"], "labels": served},
        node="gpu-a-2",
        node_yaml={"labels": {"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}},
        files={
            "/etc/containerd/conf.d/registry.toml": '[plugins."io.containerd.grpc.v1.cri"'
            '.registry]\n  config_path = "/etc/containerd/certs.d"\n'
        },
        cluster={
            **DEFAULTS["cluster"],
            "cluster_policy": {
                "driver": {"version": "550.90.07", "upgradePolicy": {"autoUpgrade": True}}
            },
        },
    )
    fix = tmp_path / "fix.yaml"
    assert run(capsys, "--facts", str(facts), "--fix", str(fix))[0] == 1
    document = yaml.safe_load(fix.read_text())
    assert document["targets"] == {"nodes": ["gpu-a-2"]}
    assert document["changes"] == [
        {"driver-upgrade": {"version": "550.90.07", "mode": "operator", "retry_failed": True}}
    ]
    assert "repairs: gpu-a-2: operator.upgrade-failed" in fix.read_text()
    assert "# repairs operator.upgrade-failed on gpu-a-2:" in fix.read_text()
    assert "# how: relabelling the node upgrade-required is the GPU Operator's" in fix.read_text()
    assert "gpu-a-2: runtime.shadowing: run `rollout diagnose --fix` again" in fix.read_text()
    assert main(["plan", str(fix), "--facts", str(facts)]) == 0
    out = capsys.readouterr().out
    assert "relabel nvidia.com/gpu-driver-upgrade-state upgrade-failed -> upgrade-required" in out


def test_a_v2_drop_in_ignored_on_2_1_is_reported_from_recorded_facts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's `rollout diagnose --facts DIR`: containerd 2.1 ignores a version-2 registry
    drop-in beside the toolkit's version-3 one; the node is not called clean."""
    facts = tmp_path / "facts"
    build_facts(
        facts,
        all_nodes=DEFAULTS["all_nodes"],
        node="gpu-b-1",
        files={"/etc/containerd/conf.d/50-registry.toml": V2_REGISTRY},
        cluster=DEFAULTS["cluster"],
    )
    code, out, _ = run(capsys, "gpu-b-1", "--facts", str(facts))
    assert code == 0  # a warning: no GPU is lost
    assert "warning gpu-b-1 runtime runtime.dropin-ignored" in out
    assert (
        "does not load the version-2 CRI settings of /etc/containerd/conf.d/50-registry.toml" in out
    )
    assert 'not loaded: plugins."io.containerd.grpc.v1.cri".registry.config_path' in out
    code, out, _ = run(capsys, "gpu-b-1", "--facts", str(facts), "--output", "json")
    [finding] = [f for f in json.loads(out)["findings"] if f["check"] == "runtime.dropin-ignored"]
    assert (finding["node"], finding["severity"]) == ("gpu-b-1", "warning")


def test_plan_warns_with_the_same_answer_diagnose_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One decision for both: `rollout plan` shows the node's unloaded drop-in with the
    engine's sentence, and diagnose's finding gives the same why and the same settings."""
    facts = tmp_path / "facts"
    fleet = build_facts(
        facts,
        all_nodes=DEFAULTS["all_nodes"],
        node="gpu-b-1",
        files={"/etc/containerd/conf.d/50-registry.toml": V2_REGISTRY},
        cluster=DEFAULTS["cluster"],
    )
    node = next(n for n in fleet.nodes if n.name == "gpu-b-1")
    [unloaded] = find_unloaded(node.config_files, node.containerd)
    assert main(["plan", str(EXAMPLES.parent / "plan.yaml"), "--facts", str(facts)]) == 0
    assert f"shadowed: {unloaded.describe()}" in " ".join(capsys.readouterr().out.split())
    code, out, _ = run(capsys, "gpu-b-1", "--facts", str(facts), "--output", "json")
    assert code == 0
    [finding] = [f for f in json.loads(out)["findings"] if f["check"] == "runtime.dropin-ignored"]
    assert unloaded.why in finding["cause"]
    assert f"not loaded: {unloaded.shown()}" in finding["evidence"]
