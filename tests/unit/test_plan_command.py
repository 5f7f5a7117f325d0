"""`rollout plan --facts`: the example fleet end to end, through the command line."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.containerd import ConfigFiles, dump_config
from rollout.facts import load_recorded_facts
from rollout.transports.local import LocalRunner
from tests.conftest import containerd_binary
from tests.examples import FACTS, PLAN, edited_plan
from tests.planning import time_slicing_plan
from tests.unit.test_executor import KINDS

NVIDIA_HANDLERS = {"nvidia", "nvidia-cdi", "nvidia-legacy"}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["plan", *args, "--output", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def nodes_of(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for wave in data["waves"] for n in wave["nodes"]}


def apply_plan_to_facts(data: dict[str, Any], facts: Path) -> None:
    """Write every planned file into a copy of the recorded facts, as apply would on the node."""
    for name, node in nodes_of(data).items():
        for change in node["files"]:
            target = facts / name / "files" / change["path"].lstrip("/")
            if change["after"] is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(change["after"])


def test_example_plan_waves_and_steps(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, str(PLAN), "--facts", str(FACTS))
    assert data["has_changes"] is True
    assert [[n["name"] for n in w["nodes"]] for w in data["waves"]] == [
        ["gpu-a-1"],
        ["gpu-a-2", "gpu-a-3"],
        ["gpu-b-1"],
    ]
    node = nodes_of(data)["gpu-a-1"]
    assert [s["kind"] for s in node["steps"]] == list(KINDS)
    intended = [c for c in node["effective_changes"] if c["intended"]]
    assert intended == [
        {
            "path": 'plugins."io.containerd.grpc.v1.cri".registry.config_path',
            "before": "",
            "after": "/etc/containerd/certs.d",
            "intended": True,
        }
    ]
    # on 1.x the toolkit's drop-in replaces the main config's CRI table: both carry the intent
    paths = {f["path"] for f in node["files"]}
    assert paths == {
        "/etc/containerd/config.toml",
        "/etc/containerd/conf.d/99-nvidia.toml",
        "/etc/containerd/certs.d/docker.io/hosts.toml",
    }


def test_broken_node_shows_shadowing_and_repair(capsys: pytest.CaptureFixture[str]) -> None:
    broken = nodes_of(run_json(capsys, str(PLAN), "--facts", str(FACTS)))["gpu-a-3"]
    assert len(broken["shadowing"]) == 1
    text = broken["shadowing"][0]
    assert "/etc/containerd/conf.d/registry.toml replaces the whole" in text
    assert "containerd.runtimes.nvidia" in text
    assert broken["repairs"] and "nvidia, nvidia-cdi, nvidia-legacy" in broken["repairs"][0]
    restored = {c["path"] for c in broken["effective_changes"] if not c["intended"]}
    # containerd loads its default `containerd` table (runc) before the repair too: only the
    # toolkit's handlers come back
    runtimes = 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes'
    assert restored == {f"{runtimes}.{name}" for name in NVIDIA_HANDLERS}
    for other in ("gpu-a-1", "gpu-a-2", "gpu-b-1"):
        assert (
            nodes_of(run_json(capsys, str(PLAN), "--facts", str(FACTS)))[other]["shadowing"] == []
        )


def test_text_output_names_the_shadowing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(PLAN), "--facts", str(FACTS), "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert "shadowed: /etc/containerd/conf.d/registry.toml replaces the whole" in out
    assert "4 of 4 node(s) change" in out
    # grouped: the broken node first, each wave's groups in the summary
    assert (
        out.index("Group 1 (already broken)") < out.index("nodes: gpu-a-3") < out.index("Group 2")
    )
    assert "wave 3: 1 node(s) from group 4 (1); 4 GPU(s) on 1 node(s) out of service" in out
    assert main(["plan", str(PLAN), "--facts", str(FACTS), "--color", "never", "--full"]) == 0
    assert "Wave 3: gpu-b-1" in capsys.readouterr().out


def test_markdown_output_is_a_review_comment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(PLAN), "--facts", str(FACTS), "--output", "markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### rollout plan `registry-mirror`")
    assert "#### Group 1 (already broken)" in out and "Nodes: gpu-a-3" in out
    assert "```diff" in out
    assert main(["plan", str(PLAN), "--facts", str(FACTS), "-o", "markdown", "--full"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | gpu-a-3 |" in out
    assert "```diff" in out and "<details>" in out


def test_detailed_exitcode_then_converged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    facts = tmp_path / "facts"
    shutil.copytree(FACTS, facts)
    assert main(["plan", str(PLAN), "--facts", str(facts), "--detailed-exitcode"]) == 2
    capsys.readouterr()
    apply_plan_to_facts(run_json(capsys, str(PLAN), "--facts", str(facts)), facts)
    # after the writes every node already holds the intent: the plan is empty, node by node
    assert main(["plan", str(PLAN), "--facts", str(facts), "--detailed-exitcode"]) == 0
    assert "No changes." in capsys.readouterr().out
    data = run_json(capsys, str(PLAN), "--facts", str(facts))
    assert data["has_changes"] is False
    for node in nodes_of(data).values():
        assert node["files"] == [] and node["shadowing"] == []
        write = next(s for s in node["steps"] if s["kind"] == "containerd.write")
        assert write["noop_reason"] == (
            "the effective containerd config already holds the intent; "
            "/etc/containerd/certs.d/docker.io/hosts.toml already lists the plan's mirrors "
            "for docker.io"
        )


def test_bad_plan_is_located_and_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = edited_plan(tmp_path, "max_unavailable: 1", "max_unavailable: -3")
    assert main(["plan", str(bad), "--facts", str(FACTS)]) == 2
    err = capsys.readouterr().err
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if "-3" in t)
    assert f"{bad}:{line}:" in err and "policy.max_unavailable" in err
    # with --detailed-exitcode, 2 means "changes": an error is 1
    assert main(["plan", str(bad), "--facts", str(FACTS), "--detailed-exitcode"]) == 1


def test_targets_matching_nothing_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plan = edited_plan(tmp_path, "nvidia.com/gpu.present=true", "pool=none")
    assert main(["plan", str(plan), "--facts", str(FACTS)]) == 2
    assert "match no node" in capsys.readouterr().err


def test_missing_facts_option_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(PLAN)]) == 2
    assert "--facts DIR" in capsys.readouterr().err


TIME_SLICING_PLAN = time_slicing_plan(
    name="share-a100", targets="{nodes: [gpu-a-1, gpu-a-2]}", profile="a100-4x"
)


def test_time_slicing_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(TIME_SLICING_PLAN)
    data = run_json(capsys, str(plan), "--facts", str(FACTS))
    assert any("does not divide it" in w for w in data["warnings"])
    kinds = {(c["kind"], c["target"]) for c in data["cluster_changes"] if c["action"]}
    assert kinds == {
        ("configmap", "gpu-operator/time-slicing-config"),
        ("clusterpolicy", "cluster-policy"),
    }
    node = nodes_of(data)["gpu-a-1"]
    assert node["labels"] == [
        {"key": "nvidia.com/device-plugin.config", "before": None, "after": "a100-4x"}
    ]
    steps = {s["kind"]: s for s in node["steps"]}
    assert steps["gpu.wait"]["action"] == "wait for allocatable nvidia.com/gpu = 16"
    assert "cordon" not in steps  # time-slicing restarts no container runtime
    assert set(nodes_of(data)) == {"gpu-a-1", "gpu-a-2"}


@pytest.mark.containerd
@pytest.mark.parametrize("node_name", ["gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1"])
def test_planned_writes_proven_by_real_containerd(
    capsys: pytest.CaptureFixture[str], node_name: str
) -> None:
    """The real `containerd config dump` of each example node, after the planned writes."""
    data = run_json(capsys, str(PLAN), "--facts", str(FACTS))
    facts = load_recorded_facts(FACTS).by_name(node_name)
    assert facts is not None
    binary = str(containerd_binary(facts.containerd.series))
    files = dict(facts.config_files.files)
    for change in nodes_of(data)[node_name]["files"]:
        files[change["path"]] = change["after"]
    runner = LocalRunner()
    before = dump_config(runner, binary, facts.config_files)
    after = dump_config(runner, binary, ConfigFiles(facts.config_files.main_path, files))
    cri = "io.containerd.grpc.v1.cri" if facts.containerd.major == 1 else None
    runtime_id = cri or "io.containerd.cri.v1.runtime"
    images_id = cri or "io.containerd.cri.v1.images"
    handlers_after = set(after["plugins"][runtime_id]["containerd"]["runtimes"])
    assert handlers_after >= NVIDIA_HANDLERS
    assert after["plugins"][images_id]["registry"]["config_path"] == "/etc/containerd/certs.d"
    handlers_before = set(
        before["plugins"].get(runtime_id, {}).get("containerd", {}).get("runtimes", {})
    )
    if node_name == "gpu-a-3":
        assert not NVIDIA_HANDLERS & handlers_before  # the incident: handlers gone before
    else:
        assert handlers_before <= handlers_after
    hosts = files["/etc/containerd/certs.d/docker.io/hosts.toml"]
    assert tomllib.loads(hosts)["server"] == "https://registry-1.docker.io"


@pytest.mark.containerd
def test_prediction_accepts_a_repair_only_as_restored_keys() -> None:
    """On the broken node the writes give back the hidden CRI table: allowed only as additions."""
    from rollout import containerd as engine
    from rollout.changes.containerd.writes import build_intent
    from rollout.spec import load_spec

    node = load_recorded_facts(FACTS).by_name("gpu-a-3")
    assert node is not None
    intent = build_intent(load_spec(PLAN))
    assert intent is not None
    files, version = node.config_files, node.containerd
    synthesis = engine.repair_shadowing(files, version, intent)
    binary = str(containerd_binary(version.series))
    runner = LocalRunner()
    with pytest.raises(engine.PredictionRefused, match="unintended change"):
        engine.predict(runner, binary, files, synthesis.writes, intent, version)
    scope = engine.repair_scope(files, version)
    assert scope == (("plugins", "io.containerd.grpc.v1.cri"),)
    prediction = engine.predict(runner, binary, files, synthesis.writes, intent, version, scope)
    assert all(c.before is None for c in prediction.changes)  # keys only come back
    # a write that would change an existing value under the same table is still refused
    bad = [
        engine.FileWrite(
            w.path,
            w.before,
            w.after.replace("max_concurrent_downloads = 3", "max_concurrent_downloads = 7"),
        )
        if w.path.endswith("registry.toml")
        else w
        for w in synthesis.writes
    ]
    assert bad != list(synthesis.writes)
    with pytest.raises(engine.PredictionRefused, match="max_concurrent_downloads"):
        engine.predict(runner, binary, files, bad, intent, version, scope)


def test_drain_action_names_the_pods_and_their_gpus() -> None:
    import dataclasses

    from rollout.spec import load_spec
    from rollout.steps.drain import describe_drain
    from rollout.transports.kube import OwnerRef, Pod

    def pod(name: str, owner: str | None, gpus: int) -> Pod:
        owners = (OwnerRef(owner, f"{name}-owner", controller=True),) if owner else ()
        return Pod("ml", name, f"uid-{name}", "1", "gpu-a-1", "Running", owners=owners,
                   gpu_request=gpus)  # fmt: skip

    node = load_recorded_facts(FACTS).by_name("gpu-a-1")
    assert node is not None
    spec = load_spec(PLAN)
    busy = dataclasses.replace(
        node, pods=(pod("train-0", "StatefulSet", 2), pod("plugin", "DaemonSet", 0))
    )
    assert describe_drain(spec, busy) == (
        "evict 1 pod(s) through the Eviction API: ml/train-0 (2 GPU)",
        [],
    )
    bare = dataclasses.replace(node, pods=(pod("notebook", None, 1),))
    action, warnings = describe_drain(spec, bare)
    assert action == "would refuse: 1 pod(s) block the drain (see the warning)"
    assert "ml/notebook" in warnings[0] and "policy.drain.force" in warnings[0]
    assert describe_drain(spec, node) == ("evict pods through the Eviction API", [])


def test_plan_names_where_containerd_defaults_came_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each node's effective diff says whose defaults it laid the files over."""
    nodes = nodes_of(run_json(capsys, str(PLAN), "--facts", str(FACTS)))
    for name, node in nodes.items():
        series = ".".join(node["containerd_version"].split(".")[:2])
        source = node["defaults_source"]
        assert series in source, (name, source)
        assert "own config dump" in source or "recorded defaults" in source, (name, source)
    assert main(["plan", str(PLAN), "--facts", str(FACTS), "--output", "markdown"]) == 0
    assert "Effective containerd config (defaults from containerd " in capsys.readouterr().out
