"""Saved plans (rollout plan --out, rollout show): what the file holds and what is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rollout import __version__
from rollout.cli import main
from rollout.errors import ExitCode
from rollout.facts import load_recorded_facts
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.savedplan import read_saved_plan, saved_plan_data
from rollout.savedplan.gate import FactsMoved, SavedPlanGate
from rollout.spec import load_spec
from tests.examples import FACTS, PLAN, REPO

INVENTORY = REPO / "inventory" / "example.yaml"

SECRET = "s3cret-Pa55-for-the-grep"
NVIDIA_DROP_IN = "gpu-a-1/files/etc/containerd/conf.d/99-nvidia.toml"
# a registry credential the node already has, in the file the plan rewrites on containerd 1.x
CREDENTIALS = f"""
[plugins."io.containerd.grpc.v1.cri".registry.configs."registry.internal".auth]
  username = "puller"
  password = "{SECRET}"
"""


@pytest.fixture
def facts(tmp_path: Path) -> Path:
    """The example fleet, gpu-a-1 holding registry credentials."""
    copy = tmp_path / "facts"
    shutil.copytree(FACTS, copy)
    drop_in = copy / NVIDIA_DROP_IN
    drop_in.write_text(drop_in.read_text() + CREDENTIALS)
    return copy


def save(facts: Path, out: Path) -> None:
    assert main(["plan", str(PLAN), "--facts", str(facts), "--out", str(out)]) == 0


def gate_of(out: Path) -> SavedPlanGate:
    return SavedPlanGate.from_data(saved_plan_data(read_saved_plan(out))["saved_plan"])


def test_saved_plan_holds_no_secret_and_show_renders_it(
    facts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the plan itself writes the credential (apply carries it over): the test means something
    plan = build_plan(load_spec(PLAN), str(PLAN), load_recorded_facts(facts), load_playbooks())
    (gpu_a_1,) = [n for n in plan.nodes if n.name == "gpu-a-1"]
    assert any(SECRET in (f.after or "") for f in gpu_a_1.files)
    out = tmp_path / "plan.saved"
    save(facts, out)
    shown = capsys.readouterr().out
    text = out.read_text()
    assert SECRET not in text
    assert "<redacted>" in text
    assert out.stat().st_mode & 0o077 == 0
    assert main(["show", str(out), "--color", "never"]) == 0
    assert capsys.readouterr().out.startswith(shown)
    for output in ("markdown", "json"):
        assert main(["plan", str(PLAN), "--facts", str(facts), "-o", output]) == 0
        planned = capsys.readouterr().out
        assert main(["show", str(out), "-o", output]) == 0
        assert capsys.readouterr().out == planned


def test_credentials_carried_over_from_the_node(facts: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.saved"
    save(facts, out)
    saved = read_saved_plan(out)
    fleet = load_recorded_facts(facts)
    planned = build_plan(load_spec(PLAN), str(PLAN), fleet, load_playbooks())
    gate = gate_of(out)
    for node in saved.plan.nodes:
        node_facts = fleet.by_name(node.name)
        assert node_facts is not None
        admitted = gate.admit(node, node_facts, fleet.cluster, started=False, cluster_changed=False)
        (expected,) = [n for n in planned.nodes if n.name == node.name]
        assert admitted.files == expected.files  # byte for byte what `apply PLAN` writes


def test_a_changed_file_refuses_the_node_naming_the_fact(facts: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.saved"
    save(facts, out)
    saved = read_saved_plan(out)
    before = saved.facts["gpu-a-1"]["conf.d/99-nvidia.toml"]
    drop_in = facts / NVIDIA_DROP_IN
    drop_in.write_text(drop_in.read_text() + "# edited by hand\n")
    fleet = load_recorded_facts(facts)
    (node,) = [n for n in saved.plan.nodes if n.name == "gpu-a-1"]
    node_facts = fleet.by_name("gpu-a-1")
    assert node_facts is not None
    with pytest.raises(FactsMoved) as refused:
        gate_of(out).admit(node, node_facts, fleet.cluster, started=False, cluster_changed=False)
    message = str(refused.value)
    assert message.startswith("gpu-a-1: conf.d/99-nvidia.toml changed since the plan was saved")
    assert before in message and "plan again" in message


def test_two_moved_facts_are_named_in_one_refusal(facts: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.saved"
    save(facts, out)
    saved = read_saved_plan(out)
    for path in (NVIDIA_DROP_IN, "gpu-a-1/files/etc/containerd/config.toml"):
        (facts / path).write_text((facts / path).read_text() + "# edited by hand\n")
    fleet = load_recorded_facts(facts)
    (node,) = [n for n in saved.plan.nodes if n.name == "gpu-a-1"]
    node_facts = fleet.by_name("gpu-a-1")
    assert node_facts is not None
    with pytest.raises(FactsMoved) as refused:
        gate_of(out).admit(node, node_facts, fleet.cluster, started=False, cluster_changed=False)
    message = str(refused.value)
    assert "config.toml changed since" in message and "99-nvidia.toml changed since" in message
    assert message.count("plan again") == 1
    assert message.endswith("; plan again (gpu-a-1 was not touched)")


def test_a_changed_credential_is_not_carried(facts: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.saved"
    save(facts, out)
    saved = read_saved_plan(out)
    drop_in = facts / NVIDIA_DROP_IN
    drop_in.write_text(drop_in.read_text().replace(SECRET, "another-password"))
    fleet = load_recorded_facts(facts)
    (node,) = [n for n in saved.plan.nodes if n.name == "gpu-a-1"]
    node_facts = fleet.by_name("gpu-a-1")
    assert node_facts is not None
    # a node this run started is not compared again; its credentials still must match
    with pytest.raises(FactsMoved, match="credentials the saved plan carries over"):
        gate_of(out).admit(node, node_facts, fleet.cluster, started=True, cluster_changed=False)


def refused(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["show", str(path)]) == ExitCode.BAD_INPUT
    return capsys.readouterr().err


def test_edited_truncated_and_other_version_are_refused(
    facts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.saved"
    save(facts, out)
    text = out.read_text()
    edited = tmp_path / "edited.saved"
    edited.write_text(text.replace('"max_unavailable": 1', '"max_unavailable": 3', 1))
    assert edited.read_text() != text
    assert "was edited since it was saved" in refused(edited, capsys)
    truncated = tmp_path / "truncated.saved"
    truncated.write_text(text[: len(text) // 2])
    assert "truncated or damaged" in refused(truncated, capsys)
    header, _, body = text.partition("\n")
    document = json.loads(body)
    document["tool_version"] = "0.0.1"
    other = tmp_path / "other.saved"
    other.write_text(header + "\n" + json.dumps(document))
    message = refused(other, capsys)
    assert f"saved by rollout 0.0.1 (format 1); this is rollout {__version__}" in message


def test_apply_detects_a_saved_plan_by_its_content(
    facts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "reviewed.yaml"  # named like a plan.yaml
    save(facts, out)
    out.write_text(out.read_text().replace('"max_unavailable": 1', '"max_unavailable": 3', 1))
    capsys.readouterr()
    assert main(["apply", str(out), "-i", str(tmp_path / "none.yaml")]) == ExitCode.BAD_INPUT
    assert "was edited since it was saved" in capsys.readouterr().err


def test_schedule_takes_a_saved_plan_whole(
    facts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.saved"
    save(facts, out)
    capsys.readouterr()
    image = "rollout@sha256:" + "0" * 64
    args = ["schedule", str(out), "--image", image, "-i", str(INVENTORY), "--cron", "0 2 * * *"]
    assert main([*args, "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    manifests = document["items"] if isinstance(document, dict) else document
    texts = [v for m in manifests if m["kind"] == "ConfigMap" for v in m["data"].values()]
    assert out.read_text() in texts  # the pod's `rollout apply` runs the saved plan
